"""WorkerLoop: what both worker roles share — the link to the supervisor, heartbeats,
page telemetry, live configuration, and the poll loop that drives the role's work.

A supervisor command goes to the worker's `on_<op>` method, found once per class from the
registry (engine/wire/messages/to_worker.py says which roles take which op); the worker
sends typed reports (engine/wire/messages/to_supervisor.py) and nothing else.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable

import torch
import zmq

from engine.config import CORE_SLOTS, EngineConfig
from engine.core import Engine
from engine.errors import PageWardenError
from engine.wire.messages import to_supervisor as report
from engine.wire.messages import to_worker as command
from engine.wire.messages.base import WorkerCommand, WorkerReport
from engine.wire.messages.codec import header_of, open_message, read
from engine.wire.messages.dispatch import handler_table
from engine.wire.messages.registry import BUS_TO_SUPERVISOR, BUS_TO_WORKER
from engine.wire.protocol import Message, ProtocolError, pack, page_arrays, unpack
from engine.wire.sockets import drain, harden
from engine.workers.core_share import CoreShare, worth_sharing
from engine.workers.page_telemetry import PageTelemetry

HEARTBEAT_S = 0.5
ORPHAN_S = 15.0  # no word from the supervisor for this long: it is gone, so exit


class WorkerLoop:
    role = "worker"
    # bus op class -> its handler, for a role class (a subclass naming its role)
    handlers: dict[type[WorkerCommand], Callable[..., None]] = {}

    def __init_subclass__(cls, **kwargs) -> None:
        """A role's handlers are exactly the ops declared for it: checked when the class is made."""
        super().__init_subclass__(**kwargs)
        cls.handlers = handler_table(cls, BUS_TO_WORKER, takes=lambda message: cls.role in message.roles,
                                     not_ops=("on_ready",))  # on_ready: the poller's hook, not an op

    def __init__(self, name: str, bus_endpoint: str, token: str, config: EngineConfig, run_dir: str,
                 core_slot: int = 0):
        self.name, self.token, self.config, self.run_dir = name, token, config, run_dir
        self.ctx = zmq.Context()
        self.bus = harden(self.ctx.socket(zmq.DEALER), "bus")
        self.bus.setsockopt(zmq.IDENTITY, name.encode())
        self.bus.connect(bus_endpoint)
        self.engine = Engine(config, pool=self.role, pool_name=name)
        # a CPU worker with `workers.threads` 0 takes its share of the cores before each layer,
        # for a model big enough to gain from it (a smaller one keeps its fixed part)
        shared = (config.workers.threads == 0 and self.engine.pool.device.type == "cpu"
                  and worth_sharing(self.engine.model.decoder))
        self.cores = (CoreShare(run_dir, core_slot, CORE_SLOTS,
                                len(os.sched_getaffinity(0))) if shared else None)
        self.engine.model.decoder.at_layer_boundary = self._at_layer_boundary  # alive inside long forwards too
        self.telemetry = PageTelemetry(self.engine.pool, self.role)
        self.poller = zmq.Poller()
        self.poller.register(self.bus, zmq.POLLIN)
        self.stopping = False
        self.bad_messages = 0
        self.ground_truth: deque[dict] = deque(maxlen=200_000)  # cross reads this worker saw happen
        self._last_heartbeat = 0.0
        self._last_heard = time.monotonic()

    # ---- sending ----------------------------------------------------------------------
    def send(self, message: WorkerReport, arrays: dict | None = None) -> None:
        """One report to the supervisor. Raises ValueError for a message not declared
        to_supervisor (before the bus)."""
        if not BUS_TO_SUPERVISOR.declares(type(message)):
            raise ValueError(f"{type(message).__qualname__} is not a bus op declared to the supervisor "
                             f"in engine/wire/messages/to_supervisor.py")
        self.bus.send_multipart(pack(header_of(message), arrays), copy=False)

    def alert(self, kind: str, severity: str, detail: str, **fields) -> None:
        self.send(open_message(report.Alert, {"kind": kind, "severity": severity, "detail": detail,
                                              "pool": self.engine.pool.name, "worker": self.name, **fields}))

    def hello(self) -> report.Hello:
        pool = self.engine.pool
        return report.Hello(
            name=self.name, role=self.role, pid=os.getpid(), token=self.token,
            device=str(pool.device), kernels=self.engine.kernels.name,
            attention=self.engine.kernels.attention,
            kernels_fallback=self.engine.kernels.fallback,
            # the most threads it computes with: its share of the cores when they are shared
            threads=self.cores.cores if self.cores is not None else torch.get_num_threads(),
            threads_shared=self.cores is not None,
            pool=report.PoolInfo(name=pool.name, pages=pool.num_pages, page_size=pool.page_size,
                                 bytes_per_page=pool.layout.bytes_per_page),
        )

    def stats(self) -> dict:
        pool = self.engine.pool
        return {"free_pages": pool.available_pages, "used_pages": pool.used_pages,
                "bad_messages": self.bad_messages, "scrubbed_pages": pool.scrubbed_pages,
                "threads_now": torch.get_num_threads()}

    # ---- the loop ---------------------------------------------------------------------
    def run(self) -> None:
        self.send(self.hello())
        try:
            while not self.stopping:
                ready = dict(self.poller.poll(0 if self.busy() else 20))
                if self.bus in ready:
                    self._drain_bus()
                self.on_ready(ready)
                self.work()
                self._cores_after_work()
                self._periodic()
        finally:
            self.close()

    def _drain_bus(self) -> None:
        for frames in drain(self.bus):
            self._last_heard = time.monotonic()
            try:
                self.handle(unpack(frames))
            except (ProtocolError, PageWardenError, KeyError, ValueError, TypeError) as exc:
                # a bad command must not take the worker down: count it and say so
                self.bad_messages += 1
                self.send(report.BadCommand(error={"code": "bad_message", "message": str(exc)}))

    def _cores_after_work(self) -> None:
        if self.cores is not None and not self.computes_next():
            self.cores.idle()  # the other workers may have its cores until its next layer

    def _at_layer_boundary(self) -> None:
        now = time.monotonic()
        if self.cores is not None:
            self.cores.computing(now)
        self._heartbeat_if_due(now)

    def _heartbeat_if_due(self, now: float | None = None) -> None:
        """The heartbeat, at most every HEARTBEAT_S: from the loop between steps, and from
        inside a forward pass at each layer boundary (this thread, this socket)."""
        now = time.monotonic() if now is None else now
        if now - self._last_heartbeat >= HEARTBEAT_S:
            self._last_heartbeat = now
            self.send(open_message(report.Heartbeat, self.stats()))

    def _periodic(self) -> None:
        now = time.monotonic()
        self._heartbeat_if_due(now)
        for header, arrays in self.telemetry.due(now):  # PageTelemetry writes its header as a dict
            self.send(report.Pages(**{k: v for k, v in header.items() if k != "op"}), arrays)
        if now - self._last_heard > ORPHAN_S and not self.bus.poll(0):
            # quiet this long with nothing waiting on the bus (a long forward pass leaves the
            # supervisor's pings unread, not unsent): the supervisor is gone
            self.stopping = True

    # ---- commands from the supervisor ----------------------------------------------------
    def handle(self, msg: Message) -> None:
        """Read one supervisor command and run this role's handler for it. Raises
        ProtocolError for an unknown or malformed op, or one declared for another role."""
        cmd = read(msg, BUS_TO_WORKER)
        handler = self.handlers.get(type(cmd))
        if handler is None:
            raise ProtocolError(f"{self.role} worker {self.name} does not take bus op {msg.op!r}: it is declared "
                                f"for {' and '.join(cmd.roles)} workers (engine/wire/messages/to_worker.py)")
        handler(self, cmd)

    def on_stop(self, cmd: command.Stop) -> None:
        self.stopping = True  # the supervisor stops this worker (a client `stop`, a restart, shutdown)

    def on_ping(self, cmd: command.Ping) -> None:
        pass  # heard: _last_heard is already set

    def on_telemetry(self, cmd: command.Telemetry) -> None:
        self.telemetry.enable(cmd.pages)

    def on_keyframe(self, cmd: command.Keyframe) -> None:
        self.telemetry.ask_keyframe()

    def on_page_metadata(self, cmd: command.PageMetadata) -> None:
        self.send(report.PageMetadata(ask_id=cmd.ask_id, pool=self.engine.pool.name),
                  page_arrays(self.engine.pool.metadata_snapshot()))

    def on_cross_reads(self, cmd: command.CrossReads) -> None:
        self.send(report.CrossReads(ask_id=cmd.ask_id, reads=list(self.ground_truth)))

    def on_configure(self, cmd: command.Configure) -> None:
        """Live settings (engine keys, defences, faults): applied between steps."""
        engine, live = self.engine, cmd.engine
        if "scrub_policy" in live:
            engine.pool.scrub_policy = str(live["scrub_policy"])
        if "max_batch" in live:
            engine.scheduler.max_batch = int(live["max_batch"])
        if "ownership_policy" in live:
            engine.config = engine.config.replace(engine={"ownership_policy": live["ownership_policy"]})
        if cmd.defences is not None or cmd.faults is not None:
            engine.config = engine.config.replace(defences=cmd.defences or {}, faults=cmd.faults or {})
        self.apply_guard(engine.config)

    def apply_guard(self, config) -> None:
        """The defences and faults of `config`, where this worker has them."""
        self.engine.runner.check_writer_tags = config.defences.writer_tag_check
        self.engine.pool.scrub_enabled = config.scrubs_freed_pages
        self.engine.runner.write_into_shared = config.faults.shared_page_written
        if self.engine.cache is not None:
            self.engine.cache.salt_ignored = config.faults.salt_ignored

    def forward_events(self) -> None:
        """Detections and ground-truth reads of the last step, to the supervisor's audit; the
        reads are kept here too, so the supervisor's log can be checked against them."""
        events = self.engine.take_events()
        if events:
            for event in events:
                if event["kind"] == "cross_read":
                    for page, source in event["reads"]:
                        self.ground_truth.append({"request": event["request"], "slot": event["slot"],
                                                  "pool": event["pool"], "page": page, "source_slot": source,
                                                  "time": event["time"]})
            self.send(report.Isolation(events=events))

    def close(self) -> None:
        try:
            if self.cores is not None:
                self.cores.close()
        finally:
            self.bus.close(linger=200)  # let the last messages (tokens, bye) leave
            self.ctx.term()

    # ---- the role's part --------------------------------------------------------------
    def busy(self) -> bool:
        return False

    def computes_next(self) -> bool:
        """Whether the loop's next turn computes again at once (its core-share mark stays)."""
        return self.busy()

    def on_ready(self, ready: dict) -> None:
        pass

    def work(self) -> None:
        pass
