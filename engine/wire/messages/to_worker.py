"""Supervisor -> worker: the commands a worker takes on the bus.

Each is handled by the worker's `on_<op>` method (engine/workers/loop.py for both roles,
prefill.py and decode.py for their own); `roles` says which roles take it.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

import msgspec

from engine.wire.messages.base import NonNegative, WorkerCommand


class Reserve(WorkerCommand, kw_only=True, tag="reserve"):
    description: ClassVar[str] = "decode: reserve pages for a request (request_id, prompt_len, max_new_tokens, ...)"
    roles: ClassVar[tuple[str, ...]] = ("decode",)

    request_id: str
    slot: NonNegative
    prompt_ids: list[int]
    params: dict[str, Any] = {}  # sampling parameters, as the submit gave them (engine/request.py)
    tenant: str = "default"
    cache_salt: Annotated[str, msgspec.Meta(max_length=256)] | None = None  # with the tenant: its prefix salt


class TransferTarget(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """Where a prefill ships a request's pages: the decode worker's KV endpoint and its reservation."""

    endpoint: str
    reservation: dict[str, Any]  # Reservation.to_wire() (engine/workers/transfer/manifest.py)


class Prefill(WorkerCommand, kw_only=True, tag="prefill"):
    description: ClassVar[str] = "prefill: compute a request's prompt and ship its pages to the decode worker's endpoint"
    roles: ClassVar[tuple[str, ...]] = ("prefill",)

    request_id: str
    slot: NonNegative
    prompt_ids: Annotated[list[int], msgspec.Meta(min_length=1)]
    params: dict[str, Any] = {}
    tenant: str = "default"
    cache_salt: Annotated[str, msgspec.Meta(max_length=256)] | None = None
    target: TransferTarget


class Cancel(WorkerCommand, kw_only=True, tag="cancel"):
    description: ClassVar[str] = "either: stop a request now (request_id)"

    request_id: str


class Release(WorkerCommand, kw_only=True, tag="release"):
    description: ClassVar[str] = "decode: give back a request's pages (request_id)"
    roles: ClassVar[tuple[str, ...]] = ("decode",)

    request_id: str


class ForgetEndpoint(WorkerCommand, kw_only=True, tag="forget_endpoint"):
    description: ClassVar[str] = "prefill: close the transfer socket of a decode worker that went away"
    roles: ClassVar[tuple[str, ...]] = ("prefill",)

    endpoint: str


class Configure(WorkerCommand, kw_only=True, tag="configure"):
    description: ClassVar[str] = "either: live settings (engine keys, defences, faults), applied between steps"

    engine: dict[str, Any] = {}  # the live engine keys only (engine/server/reconfigure.py)
    defences: dict[str, Any] | None = None  # None: leave the defences and faults as they are
    faults: dict[str, Any] | None = None


class Telemetry(WorkerCommand, kw_only=True, tag="telemetry"):
    description: ClassVar[str] = "either: send page telemetry or not (pages: bool), as the telemetry socket has viewers"

    pages: bool = False


class Keyframe(WorkerCommand, kw_only=True, tag="keyframe"):
    description: ClassVar[str] = "either: send a pages keyframe now (a viewer asked)"


class PageMetadata(WorkerCommand, kw_only=True, tag="page_metadata"):
    description: ClassVar[str] = "either: the pool's page arrays for a snapshot (ask_id)"

    ask_id: int | None = None  # echoed in the answer


class CrossReads(WorkerCommand, kw_only=True, tag="cross_reads"):
    description: ClassVar[str] = "either: the cross-request reads it saw (ask_id), for reproduction's ground truth"

    ask_id: int | None = None


class Ping(WorkerCommand, kw_only=True, tag="ping"):
    description: ClassVar[str] = "either: nothing; an answerable message"


class Stop(WorkerCommand, kw_only=True, tag="stop"):
    description: ClassVar[str] = "either: finish and exit"


ALL: tuple[type[WorkerCommand], ...] = (Reserve, Prefill, Cancel, Release, ForgetEndpoint, Configure, Telemetry,
                                        Keyframe, PageMetadata, CrossReads, Ping, Stop)
