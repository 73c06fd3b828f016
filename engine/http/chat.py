"""POST /v1/chat/completions: OpenAI chat messages rendered to one prompt, then a completion.

The prompt comes from the checkpoint's chat template (`chat_template` in its
tokenizer_config.json, a Jinja template as Hugging Face writes them, rendered in Jinja's
sandbox with `messages`, `add_generation_prompt`, `bos_token` and `eos_token`). A checkpoint
without one (the default `pagewarden-copy` has none) gets DEFAULT_TEMPLATE:

    <|system|>\\n{content}</s>\\n<|user|>\\n{content}</s>\\n<|assistant|>\\n

(one block per message, eos after each, the assistant header last), as `/v1/models` says
under `chat_template`. Everything after the messages is a completion request
(`parse_completion`'s checks: max_tokens, temperature, stop, stream, ...).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.http.openai_request import CompletionRequest, HttpError, field_error, parse_completion

ROLES = ("system", "user", "assistant", "developer", "tool")
MAX_MESSAGES = 1_024
MAX_CONTENT_BYTES = 4 << 20  # the whole conversation, as the prompt limit
DEFAULT_TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}{{ eos_token }}\n{% endfor %}"
                    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
CHAT_ONLY = ("messages", "max_completion_tokens")  # chat fields parse_completion does not know


@dataclass(frozen=True)
class ChatTemplate:
    source: str  # Jinja text
    origin: str  # where it came from: a tokenizer_config.json path, or "default"
    bos_token: str = ""
    eos_token: str = ""

    def render(self, messages: list[dict]) -> str:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

        def raise_exception(message):
            raise TemplateError(message)

        env.globals["raise_exception"] = raise_exception
        try:
            return env.from_string(self.source).render(messages=messages, add_generation_prompt=True,
                                                       bos_token=self.bos_token, eos_token=self.eos_token)
        except TemplateError as exc:  # the template refused these messages (a role order, say)
            raise HttpError(400, f"the chat template ({self.origin}) refused these messages: {exc}",
                            param="messages") from None


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
        size += len(content.encode("utf-8", "surrogatepass"))
        if size > MAX_CONTENT_BYTES:
            raise HttpError(400, f"'messages' hold more than {MAX_CONTENT_BYTES:,} bytes of content",
                            param="messages")
        messages.append({"role": m["role"], "content": content})
    return messages


def parse_chat(body, template: ChatTemplate) -> CompletionRequest:
    """A chat body -> the CompletionRequest of its rendered prompt. HttpError(400) names
    the field and the limit."""
    if not isinstance(body, dict):
        raise HttpError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    if "prompt" in body:
        raise field_error("prompt", body["prompt"], "not a chat field: send 'messages' (or use /v1/completions)")
    messages = parse_messages(body.get("messages"))
    rest = {k: v for k, v in body.items() if k not in CHAT_ONLY}
    if body.get("max_completion_tokens") is not None:
        if body.get("max_tokens") is not None and body["max_tokens"] != body["max_completion_tokens"]:
            raise field_error("max_completion_tokens", body["max_completion_tokens"],
                              f"differs from max_tokens = {body['max_tokens']!r}; send one of them")
        rest["max_tokens"] = body["max_completion_tokens"]
    rest["prompt"] = template.render(messages)
    return parse_completion(rest)
