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
from typing import TYPE_CHECKING

import zmq

from engine.capacity import check_capacity, exceeding
from engine.config import EngineConfig
from engine.errors import ConfigError, NoWorker, PageWardenError, WorkerCrashed, WorkerStartFailed, WorkerStopped
from engine.guard.canaries import CanaryBook
from engine.guard.read_log import ReadLog
from engine.model.config import read_model_config
from engine.model.text_stream import TextStream
from engine.pool_memory import check_pool_memory
from engine.server import reconfigure
from engine.server.alert_forward import AlertForwarder, instance_label, shown_config
from engine.server.alerts import AlertBook
from engine.server.audit import AuditLog
from engine.server.evidence_feed import EvidenceFeed, journal_path
from engine.server.metrics import MetricsWindow
from engine.server.prompt_text import PromptTokenizer
from engine.server.request_book import RequestBook
from engine.server.request_record import RequestRecord
from engine.server.telemetry import TelemetryPublisher
from engine.server.worker_handle import WorkerHandle
from engine.server.worker_pool import WorkerPool
from engine.wire.bus_ops import TO_WORKER, check_op
from engine.wire.protocol import CANARY_TENANT, ProtocolError, error_reply, message_id, pack, unpack
from engine.wire.roles import DEFAULT_LOCAL_ROLE, check_role
from engine.wire.sockets import bind_endpoint, drain, harden
from engine.wire.states import Phase, Topic, WorkerState

if TYPE_CHECKING:
    from engine.model.tokenizer import TextTokenizer

DEFAULT_BIND = "tcp://127.0.0.1:5650"
METRICS_PERIOD_S = 1.0
PROGRESS_PERIOD_S = 0.5
WORKERS_PERIOD_S = 2.0
CAPACITY_PERIOD_S = 10.0
QUEUED_NEEDS = ("decode", "prefill")  # what a queued request waits for, in the order it needs them
PROMPT_LOG_KEPT = 10_000  # prompt-log entries in memory (the evidence journal keeps every one)


class Supervisor:
    def __init__(self, config: EngineConfig, *, bind: str = DEFAULT_BIND, telemetry_bind: str | None = None,
                 curve=None, allow_faults: bool = False, local_role: str = DEFAULT_LOCAL_ROLE):
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
        opened: list[zmq.Socket] = []
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
        self.progressed: set[str] = set()  # requests with new tokens since the last update
        self._unplaced: set[str] = set()  # requests marked waiting for a worker (fail_unplaced)
        self.rollback = None  # engine.server.reconfigure.Rollback while a reconfigure is being taken up
        # ask id -> (client identity, its message id), or (None, reason) for the journal's own keyframe
        self.pending_metadata: dict[int, tuple[bytes | None, object]] = {}
        self.pending_truth: dict[int, dict] = {}
        self.prompt_log: deque[dict] = deque(maxlen=PROMPT_LOG_KEPT)
        self.slots = itertools.count(1)
        self.ask_ids = itertools.count(1)
        self.started_at = time.time()
        self.ever_served = False  # a decode worker was ready once (no_decode_capacity fires after that)
        self.stopping = False
        self._tokenizer: TextTokenizer | None = None
        self._last = {"metrics": 0.0, "workers": 0.0, "capacity": 0.0}
        self.workers = WorkerPool({"prefill": config.workers.prefill, "decode": config.workers.decode},
                                  self.run_dir, self.bus_endpoint, config=lambda: self.config.to_dict(),
                                  send=self.to_worker, on_spawn=self._worker_spawned,
                                  on_silent=self._worker_silent, on_stop=self._worker_stopping,
                                  on_exit=self._worker_exited)
        self.evidence = EvidenceFeed(self, journal_path(config.audit.journal, bind, config.source), run_info={
            "host": _hostname(), "control": self.control_endpoint, "config": shown_config(config),
            "engine": {"model": str(config.model.resolved_path()), "telemetry": self.telemetry_endpoint,
                       "architecture": self.model_config.architecture}})
        self.configure_canaries(config.canaries)
        self.configure_forwarding(config.alerts)
        from engine.server.control_ops import ControlOps
        from engine.server.worker_events import WorkerEvents

        self.ops = ControlOps(self)
        self.events = WorkerEvents(self)

    def _bind(self, bind: str, telemetry_bind: str | None, opened: list) -> None:
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

    def _publisher(self) -> zmq.Socket:
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

    def run(self, *, until=None) -> None:
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
            self.prompts.deliver(self.ops.tokenize_failed)
        if self.pub in ready:
            changed = self.telemetry.drain_subscriptions()
            if self.telemetry.over_limit:
                self.reset_publisher()
                changed = True
            if changed:
                self.broadcast({"op": "telemetry", "pages": self.telemetry.wants_pages()})
        self.workers.watch()
        self.dispatch()
        self.fail_unplaced()
        try:
            self.periodic()
        except Exception as exc:  # nothing in the periodic path may end the loop
            self.report_bug("periodic", "the supervisor", exc)

    def _drain(self, sock: zmq.Socket, handler) -> None:
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

    def _internal_error(self, sock: zmq.Socket, identity: bytes, body, exc: Exception) -> None:
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

    # ---- sending ----------------------------------------------------------------------
    def to_client(self, identity: bytes, frames: list) -> None:
        self.control.send_multipart([identity, *frames], copy=False)

    def to_worker(self, worker: WorkerHandle, header: dict, arrays=None) -> None:
        check_op(header["op"], TO_WORKER, "to a worker")
        self.bus.send_multipart([worker.identity, *pack(header, arrays)], copy=False)

    def broadcast(self, header: dict) -> None:
        for worker in self.workers.values():
            if worker.state in (WorkerState.READY, WorkerState.DRAINING):
                self.to_worker(worker, header)

    # ---- routing ----------------------------------------------------------------------
    def dispatch(self) -> None:
        """Give queued requests to decode workers with room, reserved ones to prefill workers."""
        page_size = self.config.engine.page_size
        max_batch = self.config.engine.max_batch
        # Reserve decode pages only for requests a prefill worker can take soon: pages held
        # for a request that waits on a missing prefill worker would be held for nothing.
        prefill_room = sum(max_batch - len(w.inflight) for w in self.workers.role("prefill") if w.accepting)
        prefill_room -= len(self.book.awaiting_prefill) + len(self.book.reserving)
        while self.book.queue and prefill_room > 0:
            rec = self.book[self.book.queue[0]]
            need = -(-(rec.prompt_len + rec.params["max_new_tokens"]) // page_size)
            decode = [w for w in self.workers.role("decode")
                      if w.accepting and len(w.inflight) < max_batch and w.free_pages >= need]
            if not decode:
                return self._dispatch_prefill()  # first come, first served: the head waits
            worker = max(decode, key=lambda w: w.free_pages)
            self.book.reserve(rec, worker.name)
            prefill_room -= 1
            worker.inflight.add(rec.request_id)
            worker.stats["free_pages"] = worker.free_pages - need  # until its next report
            self.to_worker(worker, {"op": "reserve", "request_id": rec.request_id, "slot": rec.slot,
                                    "prompt_ids": rec.prompt_ids, "params": rec.params, "tenant": rec.tenant})
            self.audit.record(rec.request_id, "reserve_sent", worker=worker.name)
            self.publish_request(rec)
        self._dispatch_prefill()

    def mark_waiting(self, rec: RequestRecord) -> None:
        """A request just queued: say at once why it cannot be placed (no ready worker of a
        role), so that its `accepted`, status and audit agree from the first moment. An audit
        asked right after `accepted` was answered in the same drain, before fail_unplaced ran
        (waiting_for None for a request that waited on a crashed prefill worker)."""
        why = self._why_none_ready()
        blocked = next((role for role in QUEUED_NEEDS if why[role]), None)
        if blocked is not None:
            rec.waiting_for = why[blocked]
            self._unplaced.add(rec.request_id)  # fail_unplaced keeps it current from here

    def _why_none_ready(self) -> dict[str, str | None]:
        """role -> why no worker of it is ready (None: one is)."""
        return {role: self.workers.why_none_ready(role) for role in QUEUED_NEEDS}

    def fail_unplaced(self, now: float | None = None) -> None:
        """Requests waiting for a role with no ready worker: their reason is in status; they
        fail after workers.unplaced_timeout_s, or at once when no worker of that role can
        come back (stopped, or crashed and not restarted). Waiting for pages is not this."""
        now = time.monotonic() if now is None else now
        why = self._why_none_ready()
        if not any(why.values()) and not self._unplaced:
            return  # the usual case: every role has a ready worker, nobody was marked waiting
        timeout = self.config.workers.unplaced_timeout_s
        for line, roles in ((self.book.queue, QUEUED_NEEDS), (self.book.awaiting_prefill, ("prefill",))):
            for rid in list(line):
                rec = self.book[rid]
                blocked = next((role for role in roles if why[role]), None)
                if blocked is None:
                    rec.waiting_for, rec.unplaced_since = None, None
                    self._unplaced.discard(rid)
                    continue
                self._unplaced.add(rid)
                if rec.waiting_for != why[blocked]:
                    rec.waiting_for = why[blocked]
                    self.publish_request(rec)
                rec.unplaced_since = rec.unplaced_since or now
                final = not self.workers.can_return(blocked)
                if final or now - rec.unplaced_since >= timeout:
                    # (blocked was picked for its why[blocked] being set)
                    self._fail_unplaced(rec, why[blocked], final, timeout)  # type: ignore[arg-type]
        self._unplaced = {rid for rid in self._unplaced if (kept := self.book.get(rid)) is not None and not kept.done}

    def _fail_unplaced(self, rec: RequestRecord, why: str, final: bool, timeout: int) -> None:
        when = "none can come back" if final else f"none became ready within {timeout} s (workers.unplaced_timeout_s)"
        error = NoWorker(f"request {rec.request_id} could not be placed: {why}; {when}")
        self._unplaced.discard(rec.request_id)
        if rec.phase == Phase.AWAITING_PREFILL:
            decode = self.workers[rec.decode_worker]  # type: ignore[index]  # RequestBook.reserve() set it
            if self.workers.alive(decode):
                self.to_worker(decode, {"op": "release", "request_id": rec.request_id})
        self.finish(rec, Phase.FAILED, error.code, error.to_wire())

    def _dispatch_prefill(self) -> None:
        max_jobs = self.config.engine.max_batch
        while (rec := self.book.next_for_prefill()) is not None:
            prefill = [w for w in self.workers.role("prefill") if w.accepting and len(w.inflight) < max_jobs]
            if not prefill:
                return
            worker = min(prefill, key=lambda w: len(w.inflight))
            worker.inflight.add(rec.request_id)
            self.book.prefill(rec, worker.name)
            # placeholder_on_reject fault: the prefill side gets a one-token stand-in
            prompt = rec.prompt_ids[:1] if rec.placeholder else rec.prompt_ids
            decode = self.workers[rec.decode_worker]  # type: ignore[index]  # RequestBook.reserve() set it
            self.to_worker(worker, {
                "op": "prefill", "request_id": rec.request_id, "slot": rec.slot, "prompt_ids": prompt,
                "params": rec.params, "target": {"endpoint": decode.info["transfer_endpoint"],
                                                 "reservation": rec.reservation},
            })
            self.audit.record(rec.request_id, "prefill_sent", worker=worker.name)
            self.publish_request(rec)

    # ---- ending requests --------------------------------------------------------------
    def finish(self, rec: RequestRecord, phase: Phase, reason: str, error: dict | None = None) -> None:
        """End a request once: tell its client, free the workers' slots, record, publish."""
        now = time.monotonic()
        if not self.book.end(rec, phase, reason, error, now):
            return
        for name in (rec.decode_worker, rec.prefill_worker):
            if name in self.workers:
                self.workers[name].inflight.discard(rec.request_id)  # type: ignore[index]  # `in` ruled out None
        if rec.first_token_at is not None and len(rec.output_ids) > 1:
            self.metrics.add_tpot((now - rec.first_token_at) / (len(rec.output_ids) - 1), now)
        self.counters[phase.value] += 1
        self.audit.record(rec.request_id, phase.value, reason=reason, error=error, tokens=len(rec.output_ids))
        if rec.tenant == CANARY_TENANT:
            self.canaries.finished(rec.request_id)
        elif rec.output_ids:
            for canary in self.canaries.markers_in(rec.output_ids, exclude_slot=rec.slot):
                self.alert("canary_marker_in_output", "critical",
                           f"the output of request {rec.request_id} carries the marker of canary "
                           f"{canary.request_id}", subject=rec.request_id, requests=[canary.request_id, rec.request_id],
                           source=canary.request_id, reader=rec.request_id, prevented=False)  # the reply went out
        if rec.client is not None:
            self.to_client(rec.client, pack({
                "op": "done", "id": rec.msg_id, "request_id": rec.request_id, "token_ids": rec.output_ids,
                "text": self.detokenize(rec.output_ids), "finish_reason": reason, "error": error,
                "ttft_s": rec.ttft_s, "elapsed_s": now - rec.arrival, "prompt_len": rec.prompt_len,
                "decode_worker": rec.decode_worker, "prefill_worker": rec.prefill_worker,
            }))
        self.publish_request(rec)
        self.book.forget_old()

    def fail_worker_requests(self, worker: WorkerHandle, error_cls, why: str) -> None:
        """A worker stopped or died: end its requests and unwind the other side of each."""
        for rid in list(worker.inflight):
            rec = self.book.get(rid)
            worker.inflight.discard(rid)
            if rec is None or rec.done:
                continue
            error = error_cls(f"request {rid} failed: {why}")
            if worker.role == "decode" and rec.phase == Phase.PREFILLING and rec.prefill_worker:
                prefill = self.workers[rec.prefill_worker]
                if prefill.accepting or prefill.state == WorkerState.DRAINING:
                    self.to_worker(prefill, {"op": "cancel", "request_id": rid})
            if worker.role == "prefill" and rec.decode_worker:
                decode = self.workers[rec.decode_worker]
                if self.workers.alive(decode):
                    # no transfer can come any more; a late one is dropped by the receiver
                    self.to_worker(decode, {"op": "release", "request_id": rid})
            self.finish(rec, Phase.FAILED, error.code, error.to_wire())
        if worker.role == "decode" and worker.info.get("transfer_endpoint"):
            for prefill in self.workers.role("prefill"):
                if self.workers.alive(prefill):
                    self.to_worker(prefill, {"op": "forget_endpoint", "endpoint": worker.info["transfer_endpoint"]})

    # ---- worker processes (their states: WorkerPool) -----------------------------------
    def stop_worker(self, worker: WorkerHandle, *, restart: bool = False) -> None:
        """Stop a worker (and start it again when `restart`); its requests fail at once."""
        self.workers.stop(worker, restart=restart)

    def _worker_stopping(self, worker: WorkerHandle) -> None:
        self.fail_worker_requests(worker, WorkerStopped, f"worker {worker.name} was stopped")
        self.publish_workers()

    def _worker_spawned(self, worker: WorkerHandle) -> None:
        self.audit_worker(worker, "spawned" if worker.spawn_reason != "restart" else "restarted")
        if worker.spawn_reason == "restart":
            self.alert("worker_restarted", "warning",
                       f"worker {worker.name} restarted after a crash (pid {worker.pid}; crash "
                       f"{worker.crashes_in_a_row} in a row, at most {self.config.workers.restart_limit})",
                       subject=worker.name, worker=worker.name)
        self.publish_workers()

    def _worker_silent(self, worker: WorkerHandle, seconds: float) -> None:
        if self.alerts.alerts.get(f"worker_unresponsive:{worker.name}", {}).get("state") != "pending":
            self.alerts.pending("worker_unresponsive", "warning", f"worker {worker.name} (pid {worker.pid}) "
                                f"silent for {seconds:.0f} s", subject=worker.name, worker=worker.name)

    def _worker_exited(self, worker: WorkerHandle, crashed: bool) -> None:
        if not crashed:
            self.fail_worker_requests(worker, WorkerStopped, f"worker {worker.name} was stopped")
            self.audit_worker(worker, "stopped")
        else:
            why = f"worker {worker.name} (pid {worker.pid}) {worker.reason}"
            self.fail_worker_requests(worker, WorkerCrashed, why)
            self.alert("worker_crashed", "critical", why, subject=worker.name, condition=True,
                       worker=worker.name, log_tail=worker.log_tail(40))
            self.alerts.resolve("worker_unresponsive", worker.name)
            self.audit_worker(worker, "crashed")
            reconfigure.worker_crashed(self, worker.name)
        self.publish_workers()

    # ---- telemetry --------------------------------------------------------------------
    def periodic(self) -> None:
        now = time.monotonic()
        if self.canaries.due(now) and any(w.accepting for w in self.workers.role("decode")):
            self.ops.fire_canary()
        if self.progressed and now - self._last.get("progress", 0.0) >= PROGRESS_PERIOD_S:
            self._last["progress"] = now
            for rid in self.progressed:
                rec = self.book.get(rid)
                if rec is not None and not rec.done:
                    self.publish_request(rec)  # token counts and TTFT of running requests
            self.progressed.clear()
        if now - self._last["metrics"] >= METRICS_PERIOD_S:
            self._last["metrics"] = now
            self.telemetry.publish(Topic.METRICS, {**self.metrics.snapshot(now), **self.load()})
        if now - self._last["workers"] >= WORKERS_PERIOD_S:
            self.publish_workers()
            self.broadcast({"op": "ping"})  # workers that hear nothing for long assume we died
        if now - self._last["capacity"] >= CAPACITY_PERIOD_S:
            self.publish_capacity()
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
                ask_id = next(self.ask_ids)
                self.pending_metadata[ask_id] = (None, reason)
                self.to_worker(worker, {"op": "page_metadata", "ask_id": ask_id})

    def log_prompt(self, entry: dict) -> None:
        self.prompt_log.append(entry)
        self.evidence.prompt(entry)

    def load(self) -> dict:
        running = self.book.running()
        pools = {}
        for w in self.workers.values():
            pool = w.info.get("pool")
            if pool:
                pools[pool["name"]] = {"role": w.role, "pages": pool["pages"],
                                       "used_pages": w.stats.get("used_pages", 0)}
        return {"queue_depth": self.book.waiting(), "running": running, "pools": pools}

    def publish_workers(self) -> None:
        self._last["workers"] = time.monotonic()
        workers = [w.describe() for w in self.workers.values()]
        self.telemetry.publish(Topic.WORKERS, {"workers": workers})
        self.evidence.changed("workers", workers, tuple((w["name"], w["state"], w["pid"], w["restarts"])
                                                        for w in workers))

    def publish_capacity(self) -> None:
        """The standing I6 finding: on the capacity topic, and as a condition alert per pool."""
        self._last["capacity"] = time.monotonic()
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
              **fields) -> None:
        self.counters[f"alert:{kind}"] += 1
        self.alerts.fire(kind, severity, detail, subject=subject, condition=condition, **fields)
        reader = fields.get("reader")
        for rid in fields.get("requests") or []:
            if isinstance(rid, str):
                # the request the alert is about, or one named as the source of the data
                role = "subject" if reader in (None, rid) else "source"
                self.audit.record(rid, f"alert:{kind}", prevented=fields.get("prevented"), detail=detail, role=role)

    def _alert_changed(self, record: dict) -> None:
        self.telemetry.publish(Topic.ALERTS, record)
        if not record.get("previous_run"):
            self.forwarder.offer(record)  # memory only: the POST happens in the forwarder's thread

    def _alert_record_changed(self, record: dict) -> None:
        evidence = getattr(self, "evidence", None)  # None only while the supervisor is being built
        if evidence is not None:
            evidence.alert_changed(record)  # every change, unthrottled; queued at the next flush

    def _audit_event(self, subject: str, event: str, when: float, fields: dict) -> None:
        evidence = getattr(self, "evidence", None)  # None only while the supervisor is being built
        if evidence is not None:
            evidence.event(subject, event, when, fields)

    def audit_worker(self, worker: WorkerHandle, event: str) -> None:
        self.audit.record(f"worker:{worker.name}", event, pid=worker.pid, reason=worker.reason)

    # ---- helpers ----------------------------------------------------------------------
    def _capacity(self, config: EngineConfig):
        return check_capacity(config, model_max_positions=self.model_config.max_position_embeddings)

    def configure_canaries(self, section) -> None:
        """Canaries as configured, unless the model cannot encode their text: then they are
        off and status says why (token-id prompts are served all the same)."""
        self.canaries.configure(section)
        self._tokenizer = None  # the model may have changed
        if self.canaries.enabled:
            try:
                self.tokenizer
            except PageWardenError as exc:
                self.canaries.disable(f"the model has no usable tokenizer ({exc}); canaries need one to "
                                      f"write their text")

    def configure_forwarding(self, section) -> None:
        """[alerts]: forward to the webhook (or stop); a new receiver hears every firing alert."""
        self.forwarder.configure(section.webhook_url, resend_s=section.webhook_resend_s,
                                 queue=section.webhook_queue, generator_url=section.generator_url)
        for record in self.alerts.live():
            self.forwarder.offer(record)

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from engine.model.tokenizer import TextTokenizer

            self._tokenizer = TextTokenizer.from_dir(self.config.model.resolved_path())
        return self._tokenizer

    def detokenize(self, ids: list[int]) -> str | None:
        try:
            return self.tokenizer.decode(ids)
        except PageWardenError:
            return None

    def text_delta(self, rec: RequestRecord) -> str | None:
        """The text rec's newest tokens add (None without a tokenizer): a short window
        decoded, not all of its output again (engine/model/text_stream.py)."""
        if rec.text is None:
            try:
                rec.text = TextStream(self.tokenizer.decode)
            except PageWardenError:
                return None
        try:
            return rec.text.delta(rec.output_ids)
        except PageWardenError:
            return None


def _hostname() -> str:
    import socket

    return socket.gethostname()


def _next_port(asked: str, bound: str) -> str:
    """The telemetry endpoint beside the control one: same host, port + 1; a random port
    when the control one was asked for as random (port 0): the port after a random one may
    belong to anyone, and serve failed to start when it did."""
    host, _, port = bound.rpartition(":")
    return f"{host}:{int(port) + 1}" if port.isdigit() and not asked.endswith(":0") else f"{host}:0"
