"""CompletionRequest: an OpenAI `/v1/completions` body, checked field by field.

Every mistake is an HttpError (400) naming the field, the value and the limit. Only the
shape and sane ranges are checked here: whether the request fits the context window and
the pools is admission's answer (I2), so the engine's own rejection reaches the client.

Which fields, decided once (a client must hear what it will not get, not get it silently):
- served: model, prompt, max_tokens, temperature, top_p, stream, stream_options, stop,
  user (the tenant), seed, and vLLM's ignore_eos and cache_salt (the prefix cache's salt: only
  requests with the same salt share cached pages; the usage says how many prompt tokens were
  cached, as `prompt_tokens_details.cached_tokens`);
- accepted at their neutral value only, with their OpenAI type (SDKs and wrappers send them
  by default): n = 1, best_of = 1, echo = false, presence_penalty = 0,
  frequency_penalty = 0, logit_bias = {}; logprobs and suffix only as null. `n: true` or
  `echo: 0` is a 400: the type is part of the value;
- vLLM's return_token_ids: read and ignored (bench/vs_vllm.py sends it to both servers); the
  reply shows it, as no choice carries token_ids;
- tools, tool_choice, functions, function_call, parallel_tool_calls: a 400 saying tools are
  not supported (null passes);
- any other field: a 400 naming it (a misspelt `max_token` used to be ignored silently).
null means "left out" for every known field. Chat's own list is in engine/http/chat.py.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

MAX_TOKENS = 1 << 21  # the engine's largest prompt; max_tokens beyond it is never sane
MAX_PROMPT_BYTES = 4 << 20  # a text prompt crosses the control socket in one msgpack header (8 MiB)
MAX_PROMPT_IDS = 1 << 21
MAX_STOP = 4  # as OpenAI: up to four stop sequences
MAX_STOP_CHARS = 256
MAX_USER_CHARS = 64  # the engine's tenant name limit
MAX_SALT_CHARS = 256  # the engine's cache_salt limit
MAX_TEMPERATURE = 2.0
MAX_NAMED_FIELDS = 5  # unknown fields named in one error, at most (a body may hold thousands)
SERVED = ("model", "prompt", "max_tokens", "temperature", "top_p", "stream", "stream_options", "stop", "user", "seed",
          "ignore_eos", "cache_salt")
TOOL_FIELDS = ("tools", "tool_choice", "functions", "function_call", "parallel_tool_calls")
IGNORED = ("return_token_ids",)  # vLLM's: a reply without token_ids says it was not served


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_zero(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0


def _never(value) -> bool:
    return False


# Fields of the OpenAI API this engine does not implement: (holds(value), what is accepted).
NEUTRAL = {
    "n": (lambda v: _is_int(v) and v == 1, "only 1 is served (one choice per request)"),
    "best_of": (lambda v: _is_int(v) and v == 1, "only 1 is served (one candidate per request)"),
    "echo": (lambda v: v is False, "only false (the prompt is not echoed back)"),
    "presence_penalty": (_is_zero, "only 0 (penalties are not applied)"),
    "frequency_penalty": (_is_zero, "only 0 (penalties are not applied)"),
    "logit_bias": (lambda v: isinstance(v, dict) and not v, "only {} (logit biases are not applied)"),
    "logprobs": (_never, "log probabilities are not returned; leave it out"),
    "suffix": (_never, "leave it out"),
}


class HttpError(Exception):
    """An OpenAI-style error: HTTP status, message, the offending field (`param`) and a code."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str = "invalid_value",
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.param, self.code, self.kind = status, param, code, kind

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}}


def field_error(name: str, value, expected: str) -> HttpError:
    shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
    return HttpError(400, f"'{name}' = {shown} is invalid: {expected}", param=name)


@dataclass(frozen=True)
class CompletionRequest:
    model: str | None
    prompt: str | None  # exactly one of prompt and prompt_ids
    prompt_ids: list[int] | None
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    stream: bool = False
    stop: tuple[str, ...] = ()
    user: str | None = None
    seed: int | None = None
    ignore_eos: bool = False
    include_usage: bool = False  # stream_options.include_usage
    cache_salt: str | None = None

    def submit_fields(self) -> dict:
        """The engine's submit fields. The stop strings are the frontend's job, so it needs the
        tokens as they come when it streams or has stop strings; a whole answer without them
        needs only the engine's `done` (one message per request, not one per token)."""
        fields = {"max_new_tokens": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p,
                  "ignore_eos": self.ignore_eos, "stream": self.stream or bool(self.stop),
                  "tenant": self.user or "default"}
        if self.seed is not None:
            fields["seed"] = self.seed
        if self.cache_salt is not None:
            fields["cache_salt"] = self.cache_salt
        if self.prompt_ids is not None:
            fields["prompt_ids"] = self.prompt_ids
        else:
            fields["prompt"] = self.prompt
        return fields


def check_fields(body: dict, served, neutral: dict) -> None:
    """Raises HttpError(400) for a tools field, an unknown field (named), or a neutral-only
    field at another value; see the module docstring."""
    for name in TOOL_FIELDS:
        if body.get(name) is not None:
            raise HttpError(400, f"'{name}' is not supported: this engine does not call tools or functions; "
                                 "leave it out", param=name, code="unsupported_parameter")
    unknown = [k for k in body if k not in served and k not in neutral and k not in TOOL_FIELDS and k not in IGNORED]
    if unknown:
        named = ", ".join(repr(k[:40]) for k in unknown[:MAX_NAMED_FIELDS])
        more = f" and {len(unknown) - MAX_NAMED_FIELDS:,} more" if len(unknown) > MAX_NAMED_FIELDS else ""
        raise HttpError(400, f"unknown field{'s' if len(unknown) > 1 else ''} {named}{more}: this endpoint reads "
                             f"{', '.join(sorted([*served, *neutral]))}", param=str(unknown[0])[:40],
                        code="unknown_parameter")
    for name, (holds, accepted) in neutral.items():
        if body.get(name) is not None and not holds(body[name]):
            raise field_error(name, body[name], f"not supported by this engine: {accepted}")


def parse_options(body: dict) -> dict:
    """Every CompletionRequest field but the prompt, checked (the fields are checked already)."""
    model = body.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise field_error("model", model, "a model name (see /v1/models)")
    return {
        "model": model,
        "max_tokens": _int(body, "max_tokens", 16, 1, MAX_TOKENS),
        "temperature": _number(body, "temperature", 1.0, 0.0, MAX_TEMPERATURE),
        "top_p": _top_p(body),
        "stream": _bool(body, "stream", False),
        "stop": _stop(body.get("stop")),
        "user": _user(body.get("user")),
        "seed": None if body.get("seed") is None else _int(body, "seed", 0, 0, (1 << 63) - 1),
        "ignore_eos": _bool(body, "ignore_eos", False),
        "include_usage": _include_usage(body.get("stream_options")),
        "cache_salt": _cache_salt(body.get("cache_salt")),
    }


def parse_completion(body) -> CompletionRequest:
    """A JSON body -> CompletionRequest. Raises HttpError(400) naming the field and the limit."""
    if not isinstance(body, dict):
        raise HttpError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    check_fields(body, SERVED, NEUTRAL)
    options = parse_options(body)
    prompt, prompt_ids = _prompt(body.get("prompt"))
    return CompletionRequest(prompt=prompt, prompt_ids=prompt_ids, **options)


def prompt_text(value: str, name: str = "prompt") -> str:
    """A text prompt: not empty, valid Unicode, at most MAX_PROMPT_BYTES. Raises HttpError(400)."""
    if not value:
        raise field_error(name, value, "an empty prompt; send at least one character")
    size = len(utf8_bytes(name, value))
    if size > MAX_PROMPT_BYTES:
        raise HttpError(400, f"'{name}' has {size:,} bytes, more than the limit {MAX_PROMPT_BYTES:,}", param=name)
    return value


def _prompt(value) -> tuple[str | None, list[int] | None]:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]  # a batch of one
    if isinstance(value, str):
        return prompt_text(value), None
    if isinstance(value, list) and value and all(_is_int(t) for t in value):
        if len(value) > MAX_PROMPT_IDS:
            raise HttpError(400, f"'prompt' has {len(value):,} token ids, more than the limit {MAX_PROMPT_IDS:,}",
                            param="prompt")
        return None, [int(t) for t in value]
    if value is None:
        raise HttpError(400, "'prompt' is required: a string or a list of token ids", param="prompt",
                        code="missing_required_parameter")
    if isinstance(value, list) and value and all(isinstance(p, (str, list)) for p in value):
        raise field_error("prompt", value, f"a batch of {len(value)} prompts; send one prompt per request")
    raise field_error("prompt", value, "a non-empty string or a non-empty list of integer token ids")


def utf8_bytes(name: str, value: str) -> bytes:
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate (JSON "\ud800") cannot cross the wire
        raise HttpError(400, f"'{name}' is not valid Unicode: {exc.object[exc.start:exc.end]!r} at character "
                        f"{exc.start} is a lone surrogate", param=name) from None


def _int(body: dict, name: str, default: int, low: int, high: int) -> int:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not _is_int(value) or not low <= value <= high:
        raise field_error(name, value, f"an integer from {low:,} to {high:,}")
    return int(value)


def _number(body: dict, name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low <= value <= high:
        raise field_error(name, value, f"a number from {low:g} to {high:g}")
    return float(value)


def _top_p(body: dict) -> float:
    value = body.get("top_p")
    if value is None:
        return 1.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value <= 1.0:
        raise field_error("top_p", value, "a number above 0 and at most 1")
    return float(value)


def _bool(body: dict, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise field_error(name, value, "true or false")
    return value


def _stop(value) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or len(stops) > MAX_STOP:
        raise field_error("stop", value, f"a string or a list of at most {MAX_STOP} strings")
    for s in stops:
        if not isinstance(s, str) or not 1 <= len(s) <= MAX_STOP_CHARS:
            raise field_error("stop", value, f"each stop sequence a string of 1 to {MAX_STOP_CHARS} characters")
    return tuple(stops)


def _user(value) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_USER_CHARS:
        raise field_error("user", value, f"a string of 1 to {MAX_USER_CHARS} characters (it names the tenant)")
    utf8_bytes("user", value)
    return value


def _cache_salt(value) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_SALT_CHARS:
        raise field_error("cache_salt", value, f"a string of 1 to {MAX_SALT_CHARS} characters (the prefix cache's "
                                               f"salt: only requests with the same one share cached prompt pages)")
    utf8_bytes("cache_salt", value)
    return value


def _include_usage(value) -> bool:
    if value is None:
        return False
    if not isinstance(value, dict) or not isinstance(value.get("include_usage", False), bool):
        raise field_error("stream_options", value, "an object like {\"include_usage\": true}")
    return value.get("include_usage", False)
