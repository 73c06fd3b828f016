"""POST /v1/chat/completions: OpenAI chat messages rendered to one prompt, then a completion.

The prompt comes from the checkpoint's chat template (`chat_template` in its
tokenizer_config.json, a Jinja template as Hugging Face writes them, with `messages`,
`add_generation_prompt`, `bos_token`, `eos_token` and `raise_exception`), rendered by
engine/http/template_renderer.py in a render process, inside limits
(engine/http/template_sandbox.py). A checkpoint without one (the default
`pagewarden-copy` has none) gets DEFAULT_TEMPLATE:

    <|system|>\\n{content}</s>\\n<|user|>\\n{content}</s>\\n<|assistant|>\\n

(one block per message, eos after each, the assistant header last), as `/v1/models` says
under `chat_template`. Everything after the messages is a completion request
(`parse_options`' checks: max_tokens, temperature, stop, stream, ...). Fields: the
completion's served and neutral ones (engine/http/openai_request.py) without prompt, echo,
best_of and suffix, plus messages and max_completion_tokens (served), and, at their neutral
value only, logprobs = false and response_format = {"type": "text"}; top_logprobs only as
null. Anything else is a 400 naming it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from engine.http.openai_request import (
    NEUTRAL,
    SERVED,
    CompletionRequest,
    HttpError,
    check_fields,
    field_error,
    parse_options,
    prompt_text,
    utf8_bytes,
)

ROLES = ("system", "user", "assistant", "developer", "tool")
MAX_MESSAGES = 1_024
MAX_CONTENT_BYTES = 4 << 20  # the whole conversation, as the prompt limit
DEFAULT_TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}{{ eos_token }}\n{% endfor %}"
                    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
CHAT_SERVED = (*(f for f in SERVED if f != "prompt"), "messages", "max_completion_tokens")
CHAT_NEUTRAL = {
    **{k: v for k, v in NEUTRAL.items() if k in ("n", "presence_penalty", "frequency_penalty", "logit_bias")},
    "logprobs": (lambda v: v is False, "only false (log probabilities are not returned)"),
    "top_logprobs": (lambda v: False, "log probabilities are not returned; leave it out"),
    "response_format": (lambda v: v == {"type": "text"}, "only {\"type\": \"text\"} (no structured output)"),
}


@dataclass(frozen=True)
class ChatTemplate:
    source: str  # Jinja text
    origin: str  # where it came from: a tokenizer_config.json path, or "default"
    bos_token: str = ""
    eos_token: str = ""



def _token_text(value) -> str:
    if isinstance(value, dict):  # {"content": "<s>", ...} as some configs write special tokens
        value = value.get("content")
    return value if isinstance(value, str) else ""


def load_template(model_dir: Path | None) -> ChatTemplate:
    """The checkpoint's chat template, or DEFAULT_TEMPLATE (with its eos token if it has one)."""
    config_path = Path(model_dir) / "tokenizer_config.json" if model_dir else None
    config = {}
    if config_path is not None and config_path.is_file():
        try:
            config = json.loads(config_path.read_text())
        except (OSError, ValueError):
            config = {}
    bos, eos = _token_text(config.get("bos_token")), _token_text(config.get("eos_token"))
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the "default" one
        template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"),
                        None)
    if isinstance(template, str) and template.strip():
        return ChatTemplate(template, str(config_path), bos, eos)
    return ChatTemplate(DEFAULT_TEMPLATE, "default", bos, eos)


def _content(i: int, value) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts: text only
        texts = []
        for part in value:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise field_error(f"messages[{i}].content", value, "a string or a list of {\"type\": \"text\", "
                                  "\"text\": ...} parts (this engine reads text only)")
            texts.append(part["text"])
        return "".join(texts)
    if value is None:
        return ""
    raise field_error(f"messages[{i}].content", value, "a string or a list of text parts")


def parse_messages(value) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise HttpError(400, "'messages' is required: a non-empty list of {\"role\", \"content\"} objects",
                        param="messages", code="missing_required_parameter" if value is None else "invalid_value")
    if len(value) > MAX_MESSAGES:
        raise HttpError(400, f"'messages' has {len(value):,} messages, more than the limit {MAX_MESSAGES:,}",
                        param="messages")
    messages, size = [], 0
    for i, m in enumerate(value):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise field_error(f"messages[{i}]", m, f"an object with a role ({', '.join(ROLES)}) and content")
        content = _content(i, m.get("content"))
        size += len(utf8_bytes(f"messages[{i}].content", content))
        if size > MAX_CONTENT_BYTES:
            raise HttpError(400, f"'messages' hold more than {MAX_CONTENT_BYTES:,} bytes of content",
                            param="messages")
        messages.append({"role": m["role"], "content": content})
    return messages


@dataclass(frozen=True)
class ChatRequest:
    messages: list[dict]
    options: dict  # every CompletionRequest field but the prompt

    def completion(self, prompt: str) -> CompletionRequest:
        """The completion of the rendered prompt. Raises HttpError(400) for an empty one."""
        return CompletionRequest(prompt=prompt_text(prompt, "messages"), prompt_ids=None, **self.options)


def parse_chat(body) -> ChatRequest:
    """A chat body -> its messages and completion options, every field checked before any
    rendering. HttpError(400) names the field and the limit."""
    if not isinstance(body, dict):
        raise HttpError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    if "prompt" in body:
        raise field_error("prompt", body["prompt"], "not a chat field: send 'messages' (or use /v1/completions)")
    check_fields(body, CHAT_SERVED, CHAT_NEUTRAL)
    messages = parse_messages(body.get("messages"))
    rest = {k: v for k, v in body.items() if k not in ("messages", "max_completion_tokens")}
    if body.get("max_completion_tokens") is not None:
        if body.get("max_tokens") is not None and body["max_tokens"] != body["max_completion_tokens"]:
            raise field_error("max_completion_tokens", body["max_completion_tokens"],
                              f"differs from max_tokens = {body['max_tokens']!r}; send one of them")
        rest["max_tokens"] = body["max_completion_tokens"]
    return ChatRequest(messages, parse_options(rest))
