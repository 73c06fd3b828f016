"""Worker -> supervisor: what a worker reports on the bus.

Each is handled by `WorkerEvents.on_<op>` (engine/server/worker_events.py). A worker sends
these and nothing else (`WorkerLoop.send`).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

import msgspec

from engine.wire.messages.base import Error, NonNegative, WorkerReport


class PoolInfo(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    name: str
    pages: int
    page_size: int
    bytes_per_page: int


class Hello(WorkerReport, kw_only=True, tag="hello", omit_defaults=True):
    description: ClassVar[str] = "a started worker: its name, role, pool, kernels and spawn token"

    name: str
    role: str
    pid: int
    token: str  # the spawn token (PAGEWARDEN_WORKER_TOKEN): a worker that lacks it is refused
    device: str
    kernels: str
    attention: str
    kernels_fallback: str  # why it computes with the slow torch references; "" when it does not
    threads: int  # the most it computes with
    threads_shared: bool  # its share of the cores, divided among the computing workers
    pool: PoolInfo
    transfer_endpoint: str | None = None  # a decode worker's KV socket

    def info(self) -> dict[str, Any]:
        """What the supervisor keeps of it (WorkerHandle.info): everything but the token."""
        out = msgspec.to_builtins(self)
        del out["token"]
        return out  # type: ignore[no-any-return]  # to_builtins of a Struct is a dict


class Heartbeat(WorkerReport, kw_only=True, tag="heartbeat"):
    description: ClassVar[str] = "liveness and stats (free and used pages, ...), every 0.5 s"

    free_pages: int
    used_pages: int
    extra: dict[str, Any] = {}  # the other stats (the role's own), kept as they come

    def stats(self) -> dict[str, Any]:
        """Every stat it carries, flat (WorkerHandle.stats)."""
        return {"free_pages": self.free_pages, "used_pages": self.used_pages, **self.extra}


class BadCommand(WorkerReport, kw_only=True, tag="bad_command"):
    description: ClassVar[str] = "a bus message it could not read"

    error: Error


class Reserved(WorkerReport, kw_only=True, tag="reserved"):
    description: ClassVar[str] = "decode: pages reserved for a request (reservation, free_pages)"

    request_id: str
    reservation: dict[str, Any]  # Reservation.to_wire(): the prefill side ships into exactly these pages
    endpoint: str
    pages: int
    free_pages: int
    cached_tokens: int = 0  # leading prompt tokens its prefix cache holds: the transfer skips their pages


class ReserveFailed(WorkerReport, kw_only=True, tag="reserve_failed", omit_defaults=True):
    description: ClassVar[str] = "decode: no room for a request"

    request_id: str
    free_pages: int
    error: Error
    final: bool = False  # it can never fit there: fail it rather than queue it again


class Prefilled(WorkerReport, kw_only=True, tag="prefilled"):
    description: ClassVar[str] = "prefill: the prompt is computed and its transfer sent"

    request_id: str
    first_token: int
    tokens: int
    pages: int
    chunks: int
    elapsed_s: float


class PrefillFailed(WorkerReport, kw_only=True, tag="prefill_failed"):
    description: ClassVar[str] = "prefill: the prompt could not be computed or shipped"

    request_id: str
    error: Error


class TransferDone(WorkerReport, kw_only=True, tag="transfer_done", omit_defaults=True):
    description: ClassVar[str] = "decode: a transfer arrived and its manifest check passed or failed"

    request_id: str
    ok: bool
    error: Error | None = None  # why it failed


class Tokens(WorkerReport, kw_only=True, tag="tokens"):
    description: ClassVar[str] = "decode: new tokens of running requests"

    items: list[tuple[str, list[int]]]  # (request_id, new token ids)
    finished: list[tuple[str, str | None, Error | None]]  # (request_id, finish reason, error)
    free_pages: int


class CancelAck(WorkerReport, kw_only=True, tag="cancel_ack"):
    description: ClassVar[str] = "either: a cancelled request is stopped"

    request_id: str
    sent: bool  # its transfer had already left


class Released(WorkerReport, kw_only=True, tag="released"):
    description: ClassVar[str] = "decode: a request's pages went back"

    request_id: str
    free_pages: int


class Pages(WorkerReport, kw_only=True, tag="pages"):
    description: ClassVar[str] = "page telemetry (keyframe or delta arrays), relayed to viewers"

    pool: str
    role: str
    kind: str  # keyframe or delta
    seq: NonNegative  # per pool: a viewer that misses one asks for a keyframe
    num_pages: int
    page_size: int
    time: float


class Alert(WorkerReport, kw_only=True, tag="alert"):
    description: ClassVar[str] = "an alert the worker raised (kind, severity, detail, ...)"

    kind: str
    severity: str = "warning"
    detail: str = ""
    pool: str | None = None
    worker: str | None = None
    extra: dict[str, Any] = {}  # requests, pages, prevented, ...: passed on with the alert

    def fields(self) -> dict[str, Any]:
        """Every field but kind, severity and detail, flat (what the alert records carry)."""
        named = {"pool": self.pool, "worker": self.worker}
        return {**{k: v for k, v in named.items() if v is not None}, **self.extra}


class Isolation(WorkerReport, kw_only=True, tag="isolation"):
    description: ClassVar[str] = "what the I1 check found in a decode step"

    events: Annotated[list[dict[str, Any]], msgspec.Meta(max_length=100_000)]


class CrossReads(WorkerReport, kw_only=True, tag="cross_reads"):
    description: ClassVar[str] = "the answer to cross_reads (ask_id, reads)"

    ask_id: int | None = None
    reads: list[dict[str, Any]] = []


class PageMetadata(WorkerReport, kw_only=True, tag="page_metadata"):
    description: ClassVar[str] = "the answer to page_metadata (ask_id, arrays)"

    ask_id: int | None = None
    pool: str | None = None


ALL: tuple[type[WorkerReport], ...] = (Hello, Heartbeat, BadCommand, Reserved, ReserveFailed, Prefilled, PrefillFailed,
                                       TransferDone, Tokens, CancelAck, Released, Pages, Alert, Isolation, CrossReads,
                                       PageMetadata)
