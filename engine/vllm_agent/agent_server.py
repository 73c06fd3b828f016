"""AgentServer: the vLLM agent's sockets, on a thread of its own inside vLLM's scheduler process.

It speaks PageWarden's protocol, so the GUI and `main.py status` attach to it as to our own
engine: a control ROUTER answering the viewer ops it can (status, ping, keyframe,
page_metadata; everything else gets a `read_only` error naming the op) and a telemetry XPUB
with `pages/vllm` keyframes and deltas (plus `refs`), `requests`, `alerts` and `capacity`.

Benches and tests (with PAGEWARDEN_ALLOW_FAULTS=1 only) may also send `pause` with
`paused: true|false`: while paused the connector takes no snapshots, so one vLLM server
can be measured with the agent's work on and off, side by side, without a restart between.
The agent is blind while paused, and says so in `status` (`engine.agent_paused`).

The scheduler hands it snapshots through `offer()` (a bounded queue: when the thread falls
behind, the oldest snapshot is dropped and counted, never the scheduler slowed down); the
checks and all publishing run here, off the scheduler's thread.
"""

from __future__ import annotations

import collections
import os
import socket
import threading
import time

import numpy as np
import zmq

from engine import __version__
from engine.http.prometheus_text import exposition
from engine.server.alerts import AlertBook
from engine.server.telemetry import TelemetryPublisher
from engine.vllm_agent.checks import check_snapshot
from engine.vllm_agent.metrics_port import MetricsPort
from engine.vllm_agent.page_book import POOL, PageBook
from engine.vllm_agent.snapshot import PoolSnapshot
from engine.vllm_agent.tenant_share import TenantShareCheck
from engine.wire.messages import control
from engine.wire.messages.codec import read
from engine.wire.messages.registry import CONTROL
from engine.wire.protocol import ProtocolError, error_reply, message_id, reply, unpack
from engine.wire.sockets import bind_endpoint, drain, harden
from engine.wire.states import Topic, WorkerState, pages_topic

KEYFRAME_PERIOD_S = 5.0
METRICS_PERIOD_S = 1.0
POLL_MS = 20
MAX_QUEUED_SNAPSHOTS = 64
# the viewer ops the agent answers (`answered_by` in engine/wire/messages/control.py); `pause`
# is the benches' switch, answered only with PAGEWARDEN_ALLOW_FAULTS=1
ANSWERED_OPS = tuple(op for op, cls in CONTROL.ops.items() if "agent" in cls.answered_by and cls.least_role == "viewer")


class AgentServer:
    def __init__(self, control: str, telemetry: str, *, num_blocks: int, block_size: int, facts: dict,
                 capacity: dict, metrics: str | None = None, metrics_allow_remote: bool = False):
        """metrics: "HOST:PORT" of a /metrics of its own (engine/vllm_agent/metrics_port.py), or None."""
        self.ctx = zmq.Context()
        self.control = harden(self.ctx.socket(zmq.ROUTER), "control")
        self.pub = harden(self.ctx.socket(zmq.XPUB), "publisher")
        self.control_endpoint = bind_endpoint(self.control, control)
        self.telemetry_endpoint = bind_endpoint(self.pub, telemetry)
        self.telemetry = TelemetryPublisher(self.pub)
        self.alerts = AlertBook(lambda record: self.telemetry.publish(Topic.ALERTS, record))
        self.book = PageBook(num_blocks, block_size)
        self.facts, self.capacity = facts, capacity
        self.started = time.time()
        self.counters = collections.Counter()
        self._queue: collections.deque[PoolSnapshot] = collections.deque()
        self._alerts_in: list[tuple] = []
        self._lock = threading.Lock()
        self._keyframe_asked = True
        self._last_keyframe = 0.0
        self._pending: list[np.ndarray] = []  # pages changed since the last pages message
        self._tokens: collections.deque[tuple[float, int]] = collections.deque()  # (time, new output tokens)
        self._output: dict[str, int] = {}  # live request -> output tokens at the last snapshot
        self._last_metrics = 0.0
        self._latest: PoolSnapshot | None = None
        self.tenant_share = TenantShareCheck()
        self._running = True
        self.paused = False  # read by the scheduler's thread each step; written only by `pause`
        # what the agent costs vLLM, in seconds: scheduler_s, wall time of the connector's
        # snapshot copies on vLLM's scheduler thread; thread_cpu_s, CPU time of this thread
        self.cost = {"scheduler_s": 0.0, "thread_cpu_s": 0.0}
        if capacity.get("exceeds"):
            self.alerts.fire("capacity_exceeds_window", "critical", capacity["message"], subject="pool:vllm",
                             condition=True, pool=POOL)
        self.metrics_port = MetricsPort(metrics, allow_remote=metrics_allow_remote) if metrics else None
        self._thread = threading.Thread(target=self._run, name="pagewarden-agent", daemon=True)
        self._thread.start()

    # ---- the scheduler's side ---------------------------------------------------------
    def offer(self, snap: PoolSnapshot) -> None:
        with self._lock:
            if len(self._queue) >= MAX_QUEUED_SNAPSHOTS:
                self._queue.popleft()
                self.counters["snapshots_dropped"] += 1
            self._queue.append(snap)

    def offer_alert(self, kind: str, detail: str, *, subject: str, requests=(), pages=(), **fields) -> None:
        """An alert found on vLLM's scheduler thread (the verifying connector's failed transfer
        checks), raised here on the agent's thread; its pages show quarantined on the map."""
        with self._lock:
            self._alerts_in.append((kind, detail, subject, tuple(requests), tuple(pages), fields))

    def close(self) -> None:
        self._running = False
        self._thread.join(timeout=5)
        if self.metrics_port is not None:
            self.metrics_port.close()
        self.control.close(linger=0)
        self.pub.close(linger=0)
        self.ctx.term()

    # ---- the agent's thread -----------------------------------------------------------
    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.control, zmq.POLLIN)
        poller.register(self.pub, zmq.POLLIN)
        while self._running:
            ready = dict(poller.poll(POLL_MS))
            if self.pub in ready:
                self.telemetry.drain_subscriptions()
                if self.telemetry.over_limit:
                    self._reset_publisher(poller)
            if self.control in ready:
                for frames in drain(self.control):
                    self._answer(frames)
            with self._lock:
                snaps, self._queue = list(self._queue), collections.deque()
                found, self._alerts_in = self._alerts_in, []
            for snap in snaps:
                self._fold(snap)
            for kind, detail, subject, requests, pages, fields in found:
                self.counters[f"findings:{kind}"] += 1
                self.alerts.fire(kind, "critical", detail, subject=subject, requests=requests, pages=pages,
                                 pool=POOL, **fields)
                changed = self.book.quarantine(pages)
                if len(changed):
                    self._pending.append(changed)
            self._publish_pages()
            self._publish_metrics()
            self.alerts.expire()
            self.cost["thread_cpu_s"] = time.thread_time()

    def _reset_publisher(self, poller: zmq.Poller) -> None:
        """Past TelemetryPublisher.limit distinct topics: close the XPUB (libzmq frees every
        subscription with it) and bind a new one where it was, as the supervisor does. A
        failure is an alert; the agent, and vLLM around it, go on either way."""
        poller.unregister(self.pub)
        try:
            self.telemetry.reset(lambda: harden(self.ctx.socket(zmq.XPUB), "publisher"), self.telemetry_endpoint)
        except zmq.ZMQError as exc:
            self.alerts.fire("telemetry_unavailable", "critical",
                             f"the telemetry publisher could not be bound again at {self.telemetry_endpoint} "
                             f"after a reset ({exc}); the control socket still answers", subject="telemetry")
        finally:  # bound again or not, the new socket is the one to poll and to close
            self.pub = self.telemetry.sock
            poller.register(self.pub, zmq.POLLIN)
        self.alerts.fire("telemetry_subscriptions_capped", "warning", self.telemetry.capped_detail(),
                         subject="telemetry", refused=self.telemetry.refused_subscriptions,
                         resets=self.telemetry.resets)

    def _fold(self, snap: PoolSnapshot) -> None:
        self.counters["snapshots"] += 1
        for finding in check_snapshot(snap) + self.tenant_share.check(snap):
            self.counters[f"findings:{finding.kind}"] += 1
            self.alerts.fire(finding.kind, finding.severity, finding.detail, subject=finding.subject,
                             requests=finding.requests, pages=finding.pages, pool=POOL, prevented=False)
        new_tokens = sum(max(0, r.output_tokens - self._output.get(rid, 0)) for rid, r in snap.requests.items())
        self._output = {rid: r.output_tokens for rid, r in snap.requests.items()}
        self._tokens.append((time.monotonic(), new_tokens))
        self._latest = snap
        changed, records = self.book.apply(snap)
        if len(changed):
            self._pending.append(changed)
        for record in records:
            self.telemetry.publish(Topic.REQUESTS, record)

    def _publish_pages(self) -> None:
        now = time.monotonic()
        header = {"pool": POOL, "role": "vllm", "num_pages": self.book.num_blocks,
                  "page_size": self.book.block_size}
        if self._keyframe_asked or now - self._last_keyframe >= KEYFRAME_PERIOD_S:
            self._keyframe_asked, self._last_keyframe, self._pending = False, now, []
            self.telemetry.publish(pages_topic(POOL), {**header, "kind": "keyframe"}, self.book.keyframe_arrays())
            self.telemetry.publish(Topic.CAPACITY, {"findings": [self.capacity]})
        elif self._pending:
            index = np.unique(np.concatenate(self._pending)).astype(np.int32)
            self._pending = []
            self.telemetry.publish(pages_topic(POOL), {**header, "kind": "delta"}, self.book.delta_arrays(index))

    def _publish_metrics(self) -> None:
        """The `metrics` topic our engine sends, from what the snapshots show: output tokens
        per second (over the last second), running and waiting requests, pool usage."""
        now = time.monotonic()
        if now - self._last_metrics < METRICS_PERIOD_S:
            return
        self._last_metrics = now
        self.telemetry.publish(Topic.METRICS, self._load(now))
        if self.metrics_port is not None:
            self.metrics_port.update(exposition(self.status()))

    def _load(self, now: float) -> dict:
        """Output tokens per second (over the last second), running and waiting requests, pool usage."""
        while self._tokens and now - self._tokens[0][0] > 1.0:
            self._tokens.popleft()
        snap = self._latest
        return {"tokens_per_s": float(sum(n for _, n in self._tokens)),
                "running": len(snap.requests) if snap else 0, "queue_depth": snap.waiting if snap else 0,
                "pools": {POOL: {"role": "vllm", "pages": self.book.num_blocks, "used_pages": self.book.used()}}}

    def _answer(self, frames: list) -> None:
        identity, body = frames[0], frames[1:]
        try:
            msg = unpack(body)
        except ProtocolError as exc:
            self.control.send_multipart([identity, *error_reply(message_id(body), exc.code, str(exc))])
            return
        op, msg_id = msg.op, msg.get("id")
        if op not in ANSWERED_OPS and not (op == "pause" and os.environ.get("PAGEWARDEN_ALLOW_FAULTS") == "1"):
            why = ("this engine is vLLM, watched read-only by PageWarden's agent: it answers "
                   f"{', '.join(ANSWERED_OPS)}" if op is not None else "no op given")
            self.control.send_multipart([identity, *error_reply(msg_id, "read_only", f"{op!r} refused: {why}")])
            return
        try:
            call = read(msg, CONTROL)
        except ProtocolError as exc:
            self.control.send_multipart([identity, *error_reply(msg_id, exc.code, f"{op}: {exc}")])
            return
        arrays = None
        if isinstance(call, control.Status):
            result = self.status(brief=call.brief)
        elif isinstance(call, control.Ping):
            result = {"pong": True, "time": time.time()}
        elif isinstance(call, control.Keyframe):
            self._keyframe_asked = True
            result = {"pools": [POOL]}
        elif isinstance(call, control.Pause):
            self.paused = call.paused
            self._keyframe_asked = self._keyframe_asked or not call.paused  # back from blind: a full picture first
            result = {"paused": call.paused}
        else:  # control.PageMetadata: the one pool there is, whichever was named
            result = {"pool": POOL, "num_pages": self.book.num_blocks, "page_size": self.book.block_size}
            arrays = self.book.keyframe_arrays()
        self.control.send_multipart([identity, *reply(msg_id, result, arrays)])

    def status(self, brief: bool = False) -> dict:
        worker = {"name": "vllm", "role": "vllm", "state": WorkerState.READY, "pid": self.facts.get("pid"),
                  "device": self.facts.get("device"), "inflight": self.book.live(),
                  "pool": {"name": POOL, "pages": self.book.num_blocks, "page_size": self.book.block_size,
                           "used_pages": self.book.used()}}
        result = {
            "engine": {"version": __version__, "name": f"vLLM {self.facts.get('vllm_version', '?')} (PageWarden agent)",
                       "role": "vllm_agent", "read_only": True, "agent_paused": self.paused,
                       "control": self.control_endpoint, "telemetry": self.telemetry_endpoint,
                       "started": self.started, "uptime_s": time.time() - self.started,
                       "hostname": socket.gethostname(), "time": time.time(), "monotonic": time.monotonic(),
                       **{k: v for k, v in self.facts.items() if k != "vllm_version"}},
            "workers": [worker],
            "capacity": [self.capacity],
            "counters": {**self.counters, **{f"alert:{kind}": n for kind, n in self.alerts.events.items()}},
            "alert_episodes": dict(self.alerts.fired),
            "load": self._load(time.monotonic()),
            "metrics": {"tokens_per_s": self._load(time.monotonic())["tokens_per_s"]},
            "cost": dict(self.cost),
            "telemetry_seq": dict(self.telemetry.seq),
            "telemetry": self.telemetry.describe(),
        }
        if not brief:
            result["alerts"] = self.alerts.records()
        return result
