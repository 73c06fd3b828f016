"""Engine -> client: answers to control ops and a submit's stream events, each carrying the
`id` of the call it answers (None when the call had none)."""

from __future__ import annotations

from typing import Any, ClassVar

from engine.wire.messages.base import ClientEvent, Error


class Reply(ClientEvent, kw_only=True, tag="reply"):
    description: ClassVar[str] = "the answer to a control op (its result; arrays for page metadata)"

    result: dict[str, Any] = {}


class ErrorReply(ClientEvent, kw_only=True, tag="error", omit_defaults=True):
    description: ClassVar[str] = "a refused call, or a submit that failed before it was accepted"

    error: Error
    request_id: str | None = None  # a refused submit's


class Accepted(ClientEvent, kw_only=True, tag="accepted"):
    description: ClassVar[str] = "a submit was admitted and queued"

    request_id: str
    slot: int


class Token(ClientEvent, kw_only=True, tag="token"):
    description: ClassVar[str] = "new tokens of a streaming request, and their text"

    request_id: str
    token_ids: list[int]
    text: str | None  # None: the engine has no tokenizer


class Done(ClientEvent, kw_only=True, tag="done"):
    description: ClassVar[str] = "a request ended: all its tokens and text, why it ended, how long it took"

    request_id: str
    token_ids: list[int]
    text: str | None  # None: the engine has no tokenizer
    finish_reason: str
    error: Error | None
    ttft_s: float | None
    elapsed_s: float
    prompt_len: int
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    decode_worker: str | None
    prefill_worker: str | None


ALL: tuple[type[ClientEvent], ...] = (Reply, ErrorReply, Accepted, Token, Done)
