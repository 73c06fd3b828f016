"""Supervisor: the engine server. Admission, routing, worker lifecycle, audit, telemetry.

It owns three sockets, all in this one thread: the control ROUTER (clients), the
telemetry XPUB, and the worker bus ROUTER (ipc in a private run directory). Workers are
separate processes; one dying never takes the supervisor down. The supervisor never
imports torch.
"""

from __future__ import annotations

import itertools
import shutil
import sys
import tempfile
import time
from collections import Counter, deque
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import zmq

from engine.capacity import CapacityFinding, check_capacity, exceeding
from engine.config import AlertsSection, CanariesSection, EngineConfig
from engine.errors import ConfigError, PageWardenError, WorkerCrashed, WorkerStartFailed, WorkerStopped
from engine.guard.canaries import CanaryBook
from engine.guard.read_log import ReadLog
from engine.model.config import ModelConfig, read_model_config
from engine.pool_memory import check_pool_memory
from engine.server.alert_forward import AlertForwarder, instance_label, shown_config
from engine.server.alerts import AlertBook
from engine.server.audit import AuditLog
from engine.server.evidence_feed import EvidenceFeed, journal_path
from engine.server.isolation_reports import IsolationReports
from engine.server.metrics import MetricsWindow
from engine.server.outbox import Outbox
from engine.server.output_text import OutputText
from engine.server.pending_asks import PendingAsks
from engine.server.placement import Placement
from engine.server.prompt_text import PromptTokenizer
from engine.server.reconfigure import Reconfigure
from engine.server.request_book import RequestBook
from engine.server.request_record import RequestRecord
from engine.server.request_route import RequestRoute
from engine.server.telemetry import TelemetryPublisher
from engine.server.topics import PERIODIC_TOPICS
from engine.server.worker_handle import WorkerHandle
from engine.server.worker_pool import UNRESPONSIVE_FIRING_S, WorkerPool
from engine.wire.messages.base import WorkerCommand
from engine.wire.messages.to_worker import Configure, Ping, Telemetry
from engine.wire.protocol import HEARTBEAT_TIMEOUT_S, Message, ProtocolError, error_reply, message_id, unpack
from engine.wire.roles import DEFAULT_LOCAL_ROLE, check_role
from engine.wire.sockets import bind_endpoint, drain, harden
from engine.wire.states import AlertState, Topic, WorkerState

if TYPE_CHECKING:
    from engine.model.tokenizer import TextTokenizer
    from engine.wire.curve import CurveServer

DEFAULT_BIND = "tcp://127.0.0.1:5650"
PROGRESS_PERIOD_S = 0.5  # running requests' token counts on the requests topic, at most this often
PING_PERIOD_S = 2.0  # workers that hear nothing for long assume the supervisor died
PROMPT_LOG_KEPT = 10_000  # prompt-log entries in memory (the evidence journal keeps every one)


class Supervisor:
    def __init__(self, config: EngineConfig, *, bind: str = DEFAULT_BIND, telemetry_bind: str | None = None,
                 curve: CurveServer | None = None, allow_faults: bool = False,
                 local_role: str = DEFAULT_LOCAL_ROLE):
        """curve: an engine.wire.curve.CurveServer, or None for plaintext (loopback only).
        allow_faults: defences may be turned off and faults on (reproducing incidents).

        Raises ConfigError when strict capacity is on and the window exceeds a pool, when a
        defence is off or a fault on without allow_faults, or a non-loopback endpoint is
        asked for without CURVE."""
        from engine.wire.curve import check_bind_policy

        check_bind_policy(bind, curve is not None)
        if telemetry_bind:
            check_bind_policy(telemetry_bind, curve is not None)
        self.allow_faults = allow_faults
        self.local_role = check_role(local_role)  # every client's role without CURVE
        config.check_faults_allowed(allow_faults)
        self.config = config
        self.curve = curve
        self.model_config = read_model_config(config.model.resolved_path())
        check_pool_memory(config, self.model_config)
        self.findings = self._capacity(config)
        if config.engine.strict_capacity and exceeding(self.findings):
            raise ConfigError("strict capacity: " + "; ".join(f.message() for f in exceeding(self.findings)))
        self.ctx = curve.context if curve is not None else zmq.Context()
        self.run_dir = Path(tempfile.mkdtemp(prefix="pagewarden-"))
        self.run_dir.chmod(0o700)  # the bus and KV sockets live here: this user only
        opened: list[zmq.Socket[bytes]] = []
        try:
            self._bind(bind, telemetry_bind, opened)
        except BaseException:  # e.g. the port is taken: give back what was opened, then say so
            for sock in opened:
                sock.close(linger=0)
            if curve is None:
                self.ctx.term()
            shutil.rmtree(self.run_dir, ignore_errors=True)
            raise
        self.poller = zmq.Poller()
        for sock in (self.control, self.bus, self.pub):
            self.poller.register(sock, zmq.POLLIN)
        self.prompts = PromptTokenizer()  # text prompts are tokenized beside the loop
        self.poller.register(self.prompts.fd, zmq.POLLIN)
        self.telemetry = TelemetryPublisher(self.pub)
        self.forwarder = AlertForwarder(instance=instance_label(self.control_endpoint))
        self.alerts = AlertBook(self._alert_changed, changed=self._alert_record_changed)
        self.reads = ReadLog()
        self.canaries = CanaryBook(config.canaries.per_minute, config.canaries.marker_chars, config.canaries.enabled)
        self.metrics = MetricsWindow()
        self.audit = AuditLog(sink=self._audit_event)
        self.counters: Counter[str] = Counter()
        self.book = RequestBook()  # every request, and the one place a phase changes
        self.prompt_log: deque[dict[str, Any]] = deque(maxlen=PROMPT_LOG_KEPT)
        self.slots = itertools.count(1)
        self.started_at = time.time()
        self.ever_served = False  # a decode worker was ready once (no_decode_capacity fires after that)
        self.stopping = False
        self.text = OutputText(lambda: self.config.model.resolved_path())
        self._last: dict[str, float] = {}  # what was last done when (monotonic): periodic()
        self.workers = WorkerPool({"prefill": config.workers.prefill, "decode": config.workers.decode},
                                  self.run_dir, self.bus_endpoint, config=lambda: self.config.to_dict(),
                                  send=self.to_worker, on_spawn=self._worker_spawned,
                                  on_silent=self._worker_silent, on_stop=self._worker_stopping,
                                  on_exit=self._worker_exited)
        self.outbox = Outbox(self.control, self.bus, self.workers)
        self.placement = Placement(self.workers)
        self.route = RequestRoute(config=lambda: self.config, book=self.book, workers=self.workers,
                                  placement=self.placement, outbox=self.outbox, audit=self.audit,
                                  metrics=self.metrics, counters=self.counters, canaries=self.canaries,
                                  text=self.text, alert=self.alert, publish=self.publish_request)
        self.isolation = IsolationReports(reads=self.reads, canaries=self.canaries, audit=self.audit,
                                          alert=self.alert, slot_owner=self.book.slot_owner, counters=self.counters)
        self.asks = PendingAsks(self.outbox, request_of=lambda slot: self.book.slot_owner(slot)
                                if isinstance(slot, int) else None,
                                keyframe=lambda pool, arrays, reason: self.evidence.keyframe(pool, arrays,
                                                                                             reason=reason))
        self.evidence = EvidenceFeed(self, journal_path(config.audit.journal, bind, config.source), run_info={
            "host": _hostname(), "control": self.control_endpoint, "config": shown_config(config),
            "engine": {"model": str(config.model.resolved_path()), "telemetry": self.telemetry_endpoint,
                       "architecture": self.model_config.architecture}})
        self.configure_canaries(config.canaries)
        self.configure_forwarding(config.alerts)
        self.reconfigure = Reconfigure(self)
        from engine.server.control_ops import ControlOps
        from engine.server.worker_events import WorkerEvents

        self.ops = ControlOps(self)
        self.events = WorkerEvents(self)

    def _bind(self, bind: str, telemetry_bind: str | None, opened: list[zmq.Socket[bytes]]) -> None:
        """Open and bind the control ROUTER, the telemetry XPUB and the worker bus."""
        curve = self.curve
        self.control = harden(self.ctx.socket(zmq.ROUTER), "control")
        opened.append(self.control)
        self.pub = self._publisher()
        opened.append(self.pub)
        if curve is not None:
            curve.secure(self.control)
        self.control_endpoint = bind_endpoint(self.control, bind)
        self.telemetry_endpoint = bind_endpoint(self.pub, telemetry_bind or _next_port(bind, self.control_endpoint))
        self.bus = harden(self.ctx.socket(zmq.ROUTER), "bus")
        opened.append(self.bus)
        # A worker's identity is its name: a second peer claiming it must not take it over.
        self.bus.setsockopt(zmq.ROUTER_HANDOVER, 0)
        self.bus_endpoint = f"ipc://{self.run_dir}/bus"
        self.bus.bind(self.bus_endpoint)

    def _publisher(self) -> zmq.Socket[bytes]:
        pub = harden(self.ctx.socket(zmq.XPUB), "publisher")
        if self.curve is not None:
            self.curve.secure(pub)
        return pub

    def reset_publisher(self) -> None:
        """More distinct subscriptions than TelemetryPublisher.limit: the publisher is closed
        and bound again (TelemetryPublisher.reset, shared with the vLLM agent). Alerts once
        per reset (coalesced by the alert book)."""
        self.poller.unregister(self.pub)
        try:
            self.telemetry.reset(self._publisher, self.telemetry_endpoint)
        finally:  # bound again or not, the new socket is the one to poll and to close
            self.pub = self.telemetry.sock
            self.poller.register(self.pub, zmq.POLLIN)
        self.alert("telemetry_subscriptions_capped", "warning", self.telemetry.capped_detail(), subject="telemetry",
                   refused=self.telemetry.refused_subscriptions, resets=self.telemetry.resets)

    # ---- lifecycle --------------------------------------------------------------------
    def start_workers(self) -> None:
        self.workers.start_all()
        self.publish_capacity()

    def wait_started(self, timeout_s: float = 600.0) -> None:
        """Serve until every worker said hello. Raises WorkerStartFailed naming the worker,
        why it ended and its log's last lines when one crashed before it was ever ready
        (unloadable weights, a pool too big for the device), or when time runs out."""
        deadline = time.monotonic() + timeout_s
        while not all(w.state == WorkerState.READY for w in self.workers.values()):
            if self.stopping:
                raise WorkerStartFailed("stopped before the workers were ready")
            failed = next((w for w in self.workers.values() if w.crashes_in_a_row and not w.ready_at), None)
            if failed is not None:
                raise WorkerStartFailed(f"worker {failed.name} could not start: {failed.reason}\n"
                                        f"{failed.log_tail(12)}")
            if time.monotonic() > deadline:
                states = ", ".join(f"{w.name} {w.state.value}" for w in self.workers.values())
                raise WorkerStartFailed(f"the workers were not ready within {timeout_s:.0f} s ({states})")
            self.poll_once(50)

    def run(self, *, until: Callable[[], bool] | None = None) -> None:
        """Serve until shutdown() is requested (or `until()` returns True)."""
        while not self.stopping and not (until and until()):
            self.poll_once(50)

    def poll_once(self, timeout_ms: int) -> None:
        ready = dict(self.poller.poll(timeout_ms))
        if self.control in ready:
            self._drain(self.control, self.ops.handle)
        if self.bus in ready:
            self._drain(self.bus, self.events.handle)
        if self.prompts.fd in ready:
            self.prompts.deliver(self.ops.submits.tokenize_failed)
        if self.pub in ready:
            changed = self.telemetry.drain_subscriptions()
            if self.telemetry.over_limit:
                self.reset_publisher()
                changed = True
            if changed:
                self.broadcast(Telemetry(pages=self.telemetry.wants_pages()))
        self.workers.watch()
        self.route.dispatch()
        self.route.fail_unplaced()
        try:
            self.periodic()
        except Exception as exc:  # nothing in the periodic path may end the loop
            self.report_bug("periodic", "the supervisor", exc)

    def _drain(self, sock: zmq.Socket[bytes],
               handler: Callable[[bytes, Message | None, list[Any]], None]) -> None:
        for frames in drain(sock):
            identity, body = frames[0].bytes, frames[1:]
            try:
                handler(identity, unpack(body) if body else None, body)
            except ProtocolError as exc:
                self.counters["bad_messages"] += 1
                if sock is self.control:
                    self.to_client(identity, error_reply(message_id(body), exc.code, str(exc)))
            except PageWardenError as exc:
                self.counters["errors"] += 1
                if sock is self.control:
                    self.to_client(identity, error_reply(message_id(body), exc.code, str(exc)))
            except Exception as exc:  # a bug in one handler must not take the whole engine down
                self._internal_error(sock, identity, body, exc)

    def _internal_error(self, sock: zmq.Socket[bytes], identity: bytes, body: list[Any], exc: Exception) -> None:
        """A handler bug: reported (report_bug), the caller answered; the engine keeps serving."""
        where = "control" if sock is self.control else "bus"
        detail = self.report_bug(where, identity[:32].decode(errors="replace"), exc)
        if sock is self.control:
            self.to_client(identity, error_reply(message_id(body), "internal_error", detail))

    def report_bug(self, where: str, peer: str, exc: Exception) -> str:
        """Log the traceback, count it, raise an internal_error alert; returns its detail.
        One alert per place and kind of failure (its count says how often), not one per
        sender: a client sending from many identities cannot flood the book."""
        import traceback

        self.counters["internal_errors"] += 1
        traceback.print_exc(file=sys.stderr)
        what = "a message from " + peer if where in ("control", "bus") else "its periodic work"
        detail = (f"supervisor bug handling {what} ({where}): {type(exc).__name__}: {exc}; "
                  "the engine keeps running (traceback in the engine log)")
        self.alert("internal_error", "error", detail, subject=f"{where}:{type(exc).__name__}", peer=peer)
        return detail

    def shutdown(self) -> None:
        """Stop every worker (kill what does not exit in time), close sockets, remove the run dir."""
        self.stopping = True
        self.workers.shutdown()
        self.forwarder.stop()
        self.evidence.close()
        self.prompts.close()
        for sock in (self.control, self.pub, self.bus):
            sock.close(linger=0)
        if self.curve is not None:
            self.curve.stop()
        self.ctx.term()
        shutil.rmtree(self.run_dir, ignore_errors=True)

    # ---- sending (Outbox) -----------------------------------------------------------
    def to_client(self, identity: bytes, frames: list[Any]) -> None:
        self.outbox.to_client(identity, frames)

    def to_worker(self, worker: WorkerHandle, message: WorkerCommand) -> None:
        self.outbox.to_worker(worker, message)

    def broadcast(self, message: WorkerCommand) -> None:
        self.outbox.broadcast(message)

    # ---- worker processes (their states: WorkerPool) -----------------------------------
    def stop_worker(self, worker: WorkerHandle, *, restart: bool = False) -> None:
        """Stop a worker (and start it again when `restart`); its requests fail at once."""
        self.workers.stop(worker, restart=restart)

    def _worker_stopping(self, worker: WorkerHandle) -> None:
        # its requests fail now; its answers to asks already queued may still come before it exits
        self.route.worker_gone(worker, WorkerStopped, f"worker {worker.name} was stopped")
        self.publish_workers()

    def _worker_spawned(self, worker: WorkerHandle) -> None:
        self.audit_worker(worker, "spawned" if worker.spawn_reason != "restart" else "restarted")
        if worker.spawn_reason == "restart":
            self.alert("worker_restarted", "warning",
                       f"worker {worker.name} restarted after a crash (pid {worker.pid}; crash "
                       f"{worker.crashes_in_a_row} in a row, at most {self.config.workers.restart_limit})",
                       subject=worker.name, worker=worker.name)
        self.publish_workers()

    def worker_ready(self, worker: WorkerHandle, kernels_fallback: str) -> None:
        """Its valid hello (WorkerPool.hello made it READY): a reconfigure's restart is done,
        its crash is over, and whether it computes with the slow references is said."""
        self.audit_worker(worker, "ready")
        self.reconfigure.worker_ready(worker.name)
        self.alerts.resolve("worker_crashed", worker.name)
        if kernels_fallback:
            self.alert("slow_kernels", "warning",
                       f"worker {worker.name} computes with the torch reference kernels, several times slower: the "
                       f"CPU module could not be built ({kernels_fallback[:300]})", subject=worker.name)
        else:
            self.alerts.resolve("slow_kernels", worker.name)
        self.to_worker(worker, Telemetry(pages=self.telemetry.wants_pages()))
        self.publish_workers()

    def _worker_silent(self, worker: WorkerHandle, seconds: float) -> None:
        """Pending from UNRESPONSIVE_S of silence, firing (counted, forwarded, audited) from
        UNRESPONSIVE_FIRING_S; its next heartbeat or its exit resolves it."""
        state = self.alerts.alerts.get(f"worker_unresponsive:{worker.name}", {}).get("state")
        detail = f"worker {worker.name} (pid {worker.pid}) silent for {seconds:.0f} s"
        if seconds >= UNRESPONSIVE_FIRING_S and state != AlertState.FIRING:
            self.alert("worker_unresponsive", "warning", detail + f" (killed past {HEARTBEAT_TIMEOUT_S:.0f} s of "
                       f"silence, then restarted as [workers] restart says)", subject=worker.name, condition=True,
                       worker=worker.name)
        elif seconds < UNRESPONSIVE_FIRING_S and state not in (AlertState.PENDING, AlertState.FIRING):
            self.alerts.pending("worker_unresponsive", "warning", detail, subject=worker.name, worker=worker.name)

    def _worker_exited(self, worker: WorkerHandle, crashed: bool) -> None:
        self.asks.worker_gone(worker)
        self.alerts.resolve("worker_unresponsive", worker.name)  # gone: silent no more, whatever comes next
        if not crashed:
            self.route.worker_gone(worker, WorkerStopped, f"worker {worker.name} was stopped")
            self.audit_worker(worker, "stopped")
        else:
            why = f"worker {worker.name} (pid {worker.pid}) {worker.reason}"
            self.route.worker_gone(worker, WorkerCrashed, why)
            self.alert("worker_crashed", "critical", why, subject=worker.name, condition=True,
                       worker=worker.name, log_tail=worker.log_tail(40))
            self.audit_worker(worker, "crashed")
            self.reconfigure.worker_crashed(worker.name)
        self.publish_workers()

    # ---- telemetry --------------------------------------------------------------------
    def periodic(self) -> None:
        now = time.monotonic()
        if self.canaries.due(now) and any(w.accepting for w in self.workers.role("decode")):
            self.ops.submits.fire_canary()
        progressed = self.route.progressed
        if progressed and now - self._last.get("progress", 0.0) >= PROGRESS_PERIOD_S:
            self._last["progress"] = now
            for rid in progressed:
                rec = self.book.get(rid)
                if rec is not None and not rec.done:
                    self.publish_request(rec)  # token counts and TTFT of running requests
            progressed.clear()
        for periodic in PERIODIC_TOPICS:
            if now - self._last.get(periodic.topic, 0.0) >= periodic.period_s:
                self._last[periodic.topic] = now
                periodic.publish(self, now)
        if now - self._last.get("ping", 0.0) >= PING_PERIOD_S:
            self._last["ping"] = now
            self.broadcast(Ping())  # workers that hear nothing for long assume we died
        self._decode_capacity()
        self.evidence.periodic(now)
        self.alerts.expire()
        if self.alerts.evicted != self._last.get("evicted", 0):  # forgotten alerts are not resent either
            self._last["evicted"] = self.alerts.evicted
            self.forwarder.keep(self.alerts.alerts)

    def _decode_capacity(self) -> None:
        """No decode worker ready: nothing can be served. Raised once one has been ready in this
        run (start-up is not an outage), resolved as soon as one is ready again."""
        why = self.workers.why_none_ready("decode")
        if why is None:
            self.ever_served = True
            self.alerts.resolve("no_decode_capacity", "decode")
        elif self.ever_served and self.alerts.alerts.get("no_decode_capacity:decode", {}).get("state") != "firing":
            self.alert("no_decode_capacity", "critical", f"no decode worker is ready: {why}; queued requests wait, "
                       f"then fail", subject="decode", condition=True)

    def ask_keyframes(self, reason: str) -> None:
        """Ask every ready worker for its page metadata, for the evidence journal (a keyframe)."""
        for worker in self.workers.values():
            if worker.state == WorkerState.READY and worker.info.get("pool"):
                self.asks.page_metadata(worker, None, reason=reason)

    def log_prompt(self, entry: dict[str, Any]) -> None:
        self.prompt_log.append(entry)
        self.evidence.prompt(entry)

    def load(self) -> dict[str, Any]:
        running = self.book.running()
        pools = {}
        for w in self.workers.values():
            pool = w.info.get("pool")
            if pool:
                pools[pool["name"]] = {"role": w.role, "pages": pool["pages"],
                                       "used_pages": w.stats.get("used_pages", 0)}
        return {"queue_depth": self.book.waiting(), "running": running, "pools": pools}

    def publish_workers(self) -> None:
        self._last[Topic.WORKERS] = time.monotonic()
        workers = [w.describe() for w in self.workers.values()]
        self.telemetry.publish(Topic.WORKERS, {"workers": workers})
        self.evidence.changed("workers", workers, tuple((w["name"], w["state"], w["pid"], w["restarts"])
                                                        for w in workers))

    def publish_capacity(self) -> None:
        """The standing I6 finding: on the capacity topic, and as a condition alert per pool."""
        self._last[Topic.CAPACITY] = time.monotonic()
        for finding in self.findings:
            if finding.exceeds:
                if self.alerts.alerts.get(f"capacity_exceeds_window:{finding.limit}", {}).get("state") != "firing":
                    self.alert("capacity_exceeds_window", "critical", finding.message(), subject=finding.limit,
                               condition=True, window_tokens=finding.window_tokens,
                               limit_tokens=finding.limit_tokens, shortfall_tokens=finding.shortfall_tokens)
            else:
                self.alerts.resolve("capacity_exceeds_window", finding.limit)
        findings = [f.to_dict() for f in self.findings]
        self.telemetry.publish(Topic.CAPACITY, {"findings": findings, "exceeds": bool(exceeding(self.findings))})
        self.evidence.changed("findings", findings, repr(findings))

    def publish_request(self, rec: RequestRecord) -> None:
        self.telemetry.publish(Topic.REQUESTS, rec.describe())

    def alert(self, kind: str, severity: str, detail: str, *, subject: str = "", condition: bool = False,
              **fields: Any) -> None:
        self.counters[f"alert:{kind}"] += 1
        self.alerts.fire(kind, severity, detail, subject=subject, condition=condition, **fields)
        reader = fields.get("reader")
        for rid in fields.get("requests") or []:
            if isinstance(rid, str):
                # the request the alert is about, or one named as the source of the data
                role = "subject" if reader in (None, rid) else "source"
                self.audit.record(rid, f"alert:{kind}", prevented=fields.get("prevented"), detail=detail, role=role)

    def _alert_changed(self, record: dict[str, Any]) -> None:
        self.telemetry.publish(Topic.ALERTS, record)
        if not record.get("previous_run"):
            self.forwarder.offer(record)  # memory only: the POST happens in the forwarder's thread

    def _alert_record_changed(self, record: dict[str, Any]) -> None:
        evidence = getattr(self, "evidence", None)  # None only while the supervisor is being built
        if evidence is not None:
            evidence.alert_changed(record)  # every change, unthrottled; queued at the next flush

    def _audit_event(self, subject: str, event: str, when: float, fields: dict[str, Any]) -> None:
        evidence = getattr(self, "evidence", None)  # None only while the supervisor is being built
        if evidence is not None:
            evidence.event(subject, event, when, fields)

    def audit_worker(self, worker: WorkerHandle, event: str) -> None:
        self.audit.record(f"worker:{worker.name}", event, pid=worker.pid, reason=worker.reason)

    def take_config(self, config: EngineConfig, model: ModelConfig, findings: list[CapacityFinding],
                    live: Configure, restart: set[str]) -> None:
        """Make `config` the running one (a reconfigure or its rollback, engine/server/reconfigure.py):
        `live` to the workers at once, the `restart` workers drained, the new state published."""
        self.config, self.model_config, self.findings = config, model, findings
        self.configure_canaries(config.canaries)
        self.configure_forwarding(config.alerts)
        self.broadcast(live)
        for name in restart:
            self.workers.drain(self.workers[name])
        self.publish_capacity()
        self.publish_workers()

    # ---- helpers ----------------------------------------------------------------------
    def _capacity(self, config: EngineConfig) -> list[CapacityFinding]:
        return check_capacity(config, model_max_positions=self.model_config.max_position_embeddings)

    def configure_canaries(self, section: CanariesSection) -> None:
        """Canaries as configured, unless the model cannot encode their text: then they are
        off and status says why (token-id prompts are served all the same)."""
        self.canaries.configure(section)
        self.text.forget()  # the model may have changed
        if self.canaries.enabled:
            try:
                self.tokenizer
            except PageWardenError as exc:
                self.canaries.disable(f"the model has no usable tokenizer ({exc}); canaries need one to "
                                      f"write their text")

    def configure_forwarding(self, section: AlertsSection) -> None:
        """[alerts]: forward to the webhook (or stop); a new receiver hears every firing alert."""
        self.forwarder.configure(section.webhook_url, resend_s=section.webhook_resend_s,
                                 queue=section.webhook_queue, generator_url=section.generator_url)
        for record in self.alerts.live():
            self.forwarder.offer(record)

    @property
    def tokenizer(self) -> TextTokenizer:
        """The model's tokenizer (OutputText loads it once); raises PageWardenError without one."""
        return self.text.tokenizer


def _hostname() -> str:
    import socket

    return socket.gethostname()


def _next_port(asked: str, bound: str) -> str:
    """The telemetry endpoint beside the control one: same host, port + 1; a random port
    when the control one was asked for as random (port 0): the port after a random one may
    belong to anyone, and serve failed to start when it did."""
    host, _, port = bound.rpartition(":")
    return f"{host}:{int(port) + 1}" if port.isdigit() and not asked.endswith(":0") else f"{host}:0"
