"""RequestRecord: one request as the supervisor tracks it from admission to its end."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from engine.model.text_stream import TextStream
from engine.wire.states import END_PHASES, Phase


DONE = END_PHASES


@dataclass
class RequestRecord:
    request_id: str
    slot: int
    tenant: str
    prompt_ids: list[int]
    params: dict[str, Any]  # sampling parameters, as the submit gave them
    client: bytes | None  # ROUTER identity of the submitting client
    msg_id: int | str | None  # the id of its submit: every event of its stream carries it
    phase: Phase = Phase.QUEUED
    decode_worker: str | None = None
    prefill_worker: str | None = None
    reservation: dict[str, Any] | None = None  # Reservation.to_wire(), from its decode worker
    cache_salt: str | None = None  # the prefix cache's salt it gave (never published)
    cached_tokens: int = 0  # prompt tokens its decode worker had in its prefix cache
    output_ids: list[int] = field(default_factory=list)
    text: TextStream | None = None  # its output text, piece by piece (the supervisor's tokenizer)
    arrival: float = field(default_factory=time.monotonic)
    arrival_wall: float = field(default_factory=time.time)
    first_token_at: float | None = None
    finished_at: float | None = None
    finish_reason: str | None = None
    error: dict[str, Any] | None = None  # {"code", "message"} as PageWardenError.to_wire() makes it
    cancel_requested: bool = False
    placeholder: bool = False  # the placeholder_on_reject fault stood in for it
    pages: dict[str, int] = field(default_factory=dict)  # pool name -> pages held
    owner: str = "local"  # who submitted it: a CURVE key, or "local:<connection>" (engine/wire/roles.py)
    budget_key: str | None = None  # whose per-client budget it counts against (None: the engine's own)
    sub_client: str = ""  # the client behind that connection, where it names one (the HTTP front's peer)
    waiting_for: str | None = None  # why it cannot be placed now (no ready worker of a role)
    unplaced_since: float | None = None

    @property
    def done(self) -> bool:
        return self.phase in DONE

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def fair_key(self) -> tuple[str, str]:
        """Whose turn it waits for in the queue (engine/server/fair_queue.py)."""
        return (self.budget_key or "", self.sub_client)

    @property
    def budget_tokens(self) -> int:
        """What it counts against its client's token budget: prompt + max_new_tokens."""
        return self.prompt_len + int(self.params.get("max_new_tokens", 0))

    @cached_property
    def prompt_hash(self) -> str:
        """What telemetry and snapshots may say about a prompt: never its text. Worked out once:
        every publish of the record says it, and a 576-token prompt took a quarter of the
        supervisor's loop to hash again at each."""
        data = b",".join(str(t).encode() for t in self.prompt_ids)
        return hashlib.sha256(data).hexdigest()[:16]

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.arrival

    def describe(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id, "slot": self.slot, "tenant": self.tenant,
            "phase": self.phase.value, "prompt_len": self.prompt_len, "prompt_hash": self.prompt_hash,
            "max_new_tokens": self.params.get("max_new_tokens"), "tokens": len(self.output_ids),
            "decode_worker": self.decode_worker, "prefill_worker": self.prefill_worker,
            "pages": dict(self.pages), "ttft_s": self.ttft_s, "finish_reason": self.finish_reason,
            "error": self.error, "arrival": self.arrival_wall, "waiting_for": self.waiting_for,
        }
