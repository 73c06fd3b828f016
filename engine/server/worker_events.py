"""WorkerEvents: each message a worker sends on the bus, read and handed to its owner.

The request flow goes to RequestRoute, isolation reports to IsolationReports, answers to
PendingAsks, page telemetry to the TelemetryPublisher, a worker's hello to the supervisor's
lifecycle (Supervisor.worker_ready).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any, Protocol

from engine.server.alerts import AlertBook
from engine.server.isolation_reports import IsolationReports
from engine.server.pending_asks import PendingAsks
from engine.server.request_route import RequestRoute
from engine.server.telemetry import TelemetryPublisher
from engine.server.worker_handle import WorkerHandle
from engine.server.worker_pool import WorkerPool
from engine.wire.messages import to_supervisor
from engine.wire.messages.codec import read
from engine.wire.messages.dispatch import handler_table
from engine.wire.messages.registry import BUS_TO_SUPERVISOR
from engine.wire.protocol import Message, ProtocolError
from engine.wire.states import WorkerState


class ListeningEngine(Protocol):
    """What reading the workers' messages needs of the supervisor, and no more."""

    workers: WorkerPool
    route: RequestRoute
    isolation: IsolationReports
    asks: PendingAsks
    telemetry: TelemetryPublisher
    alerts: AlertBook
    counters: Counter[str]

    def worker_ready(self, worker: WorkerHandle, kernels_fallback: str) -> None: ...

    def alert(self, kind: str, severity: str, detail: str, *, subject: str = "", condition: bool = False,
              **fields: Any) -> None: ...


class WorkerEvents:
    def __init__(self, sup: ListeningEngine):
        self.sup = sup
        self.handlers = handler_table(self, BUS_TO_SUPERVISOR)  # each declared report: its on_<op>

    def handle(self, identity: bytes, raw: Message | None, frames: list[Any]) -> None:
        """A worker's message: refused from an unknown peer, before a valid hello, or when it
        does not read as its op's message (ProtocolError: counted by the supervisor)."""
        worker = self.sup.workers.get(identity.decode(errors="replace"))
        if raw is None or worker is None:
            raise ProtocolError(f"bus message from unknown peer {identity[:32]!r}")
        msg = read(raw, BUS_TO_SUPERVISOR)
        if isinstance(msg, to_supervisor.Hello):
            return self.on_hello(worker, msg)
        if worker.state not in (WorkerState.READY, WorkerState.DRAINING, WorkerState.STOPPING):
            raise ProtocolError(f"worker {worker.name} spoke before a valid hello")
        worker.last_seen = time.monotonic()
        if isinstance(msg, (to_supervisor.Pages, to_supervisor.PageMetadata)):
            self.handlers[type(msg)](worker, msg, raw)  # their arrays come with them
        else:
            self.handlers[type(msg)](worker, msg)

    # ---- lifecycle ------------------------------------------------------------------
    def on_hello(self, worker: WorkerHandle, msg: to_supervisor.Hello) -> None:
        if worker.state != WorkerState.STARTING or msg.token != worker.token:
            raise ProtocolError(f"hello from {worker.name} refused: not expected or wrong token")
        self.sup.workers.hello(worker, msg.info())
        self.sup.worker_ready(worker, msg.kernels_fallback)

    def on_heartbeat(self, worker: WorkerHandle, msg: to_supervisor.Heartbeat) -> None:
        worker.heartbeat(msg.stats())
        self.sup.alerts.resolve("worker_unresponsive", worker.name)

    def on_bad_command(self, worker: WorkerHandle, msg: to_supervisor.BadCommand) -> None:
        self.sup.counters["worker_bad_commands"] += 1

    # ---- request flow: RequestRoute decides --------------------------------------------
    def on_reserved(self, worker: WorkerHandle, msg: to_supervisor.Reserved) -> None:
        worker.report_free_pages(msg.free_pages)
        self.sup.route.reserved(worker, msg.request_id, msg.reservation, msg.pages, msg.cached_tokens)

    def on_reserve_failed(self, worker: WorkerHandle, msg: to_supervisor.ReserveFailed) -> None:
        worker.report_free_pages(msg.free_pages)
        self.sup.route.reserve_failed(worker, msg.request_id, msg.final, msg.error)

    def on_prefilled(self, worker: WorkerHandle, msg: to_supervisor.Prefilled) -> None:
        self.sup.route.prefilled(worker, msg.request_id, msg.pages, chunks=msg.chunks, elapsed_s=msg.elapsed_s)

    def on_prefill_failed(self, worker: WorkerHandle, msg: to_supervisor.PrefillFailed) -> None:
        self.sup.route.prefill_failed(worker, msg.request_id, msg.error)

    def on_transfer_done(self, worker: WorkerHandle, msg: to_supervisor.TransferDone) -> None:
        self.sup.route.transfer_done(worker, msg.request_id, msg.ok, msg.error)

    def on_tokens(self, worker: WorkerHandle, msg: to_supervisor.Tokens) -> None:
        worker.report_free_pages(msg.free_pages)
        self.sup.route.tokens(worker, msg.items, msg.finished)

    def on_cancel_ack(self, worker: WorkerHandle, msg: to_supervisor.CancelAck) -> None:
        self.sup.route.cancel_acknowledged(worker, msg.request_id, msg.sent)

    def on_released(self, worker: WorkerHandle, msg: to_supervisor.Released) -> None:
        worker.report_free_pages(msg.free_pages)
        self.sup.route.released(worker, msg.request_id)

    # ---- telemetry ------------------------------------------------------------------
    def on_pages(self, worker: WorkerHandle, msg: to_supervisor.Pages, raw: Message) -> None:
        self.sup.telemetry.relay_pages(raw.header, raw.arrays)  # relayed as it came: zero-copy

    def on_alert(self, worker: WorkerHandle, msg: to_supervisor.Alert) -> None:
        fields = msg.fields()
        fields.setdefault("pool", worker.info.get("pool", {}).get("name", worker.name))
        self.sup.alert(msg.kind, msg.severity, msg.detail, subject=str(fields["pool"]), **fields)

    # ---- the isolation guard: IsolationReports ------------------------------------------
    def on_isolation(self, worker: WorkerHandle, msg: to_supervisor.Isolation) -> None:
        """I1 detections and cross-request reads (ground truth) from a worker's last steps."""
        self.sup.isolation.report(msg.events)

    # ---- answers: PendingAsks ------------------------------------------------------------
    def on_cross_reads(self, worker: WorkerHandle, msg: to_supervisor.CrossReads) -> None:
        self.sup.asks.cross_reads_answered(worker, msg.ask_id, msg.reads)

    def on_page_metadata(self, worker: WorkerHandle, msg: to_supervisor.PageMetadata, raw: Message) -> None:
        self.sup.asks.page_metadata_answered(worker, msg.ask_id, msg.pool, raw.arrays)
