"""EngineState: everything the window shows, rebuilt from telemetry and status replies.

Qt-free: `apply(message)` folds one decoded telemetry message in, says which parts changed
and marks them in `events` (one emitter per part, EVENTS); views connect to the parts they
show, and the window's 10 Hz timer flushes the marks, so each view repaints at most once a
frame from the latest state. `selection` is the window's one selected request. Every topic,
known or not, also lands in `topics` (its latest payload) and marks `topic:<name>` and
`topics`: a new topic needs no edit here unless it needs typed handling (`_on_<topic>`).
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field, replace

import numpy as np

from engine.client import PageMirror
from engine.wire.page_tags import PageState
from engine.wire.protocol import Message
from engine.wire.states import END_PHASES, PAGES_PREFIX, WORKER_UP, AlertState, Phase
from gui.model.alert_rows import AlertRow, RestartMark, alert_row, restart_marker
from gui.model.crossings import Crossing, CrossingWatch
from gui.model.events import Events
from gui.model.find import Find
from gui.model.page_history import PageHistory
from gui.model.selection import Selection
from gui.model.topic_log import TOPIC_EVENT_PREFIX, TopicLog, topic_event

MAX_REQUESTS = 5_000  # rows kept in the requests table (oldest finished ones go first)
MAX_ALERTS = 2_000
MAX_TIMELINE = 32  # phase changes kept per request
STALE_AFTER_S = 3.0  # no telemetry for this long: show everything as stale, not healthy
METRIC_WINDOW_S = 600.0  # the plots show the last ten minutes
METRIC_SERIES = ("tokens_per_s", "ttft_ms_p50", "tpot_ms_p50", "queue_depth", "running")
# What a view can follow. A telemetry topic T handled by `_on_T` marks event T; every topic
# T, handled or not, marks `topic:T` (declared on first use) and `topics`; status replies
# mark workers/capacity/engine; the window marks connection (the link changed) and frame
# (every repaint: what depends on the clock alone); check_stale marks stale; selection is
# emitted at once by `selection`.
EVENTS = ("pages", "requests", "alerts", "workers", "capacity", "engine", "metrics", "connection", "stale",
          "frame", "selection", "crossings", "history", "find", "rewind", "topics")
MAX_RESTARTS = 100  # restart marks kept (the plots show those in their span)


@dataclass
class WorkerRow:
    """One worker as the engine's status or `workers` topic last described it."""

    name: str
    role: str
    state: str
    pid: int | None
    device: str | None
    pool: str
    pages: int | None
    used_pages: int | None
    inflight: int
    reason: str = ""
    restarts: int = 0
    uptime_s: float | None = None  # as the engine said it, at `seen_at`
    seen_at: float | None = None  # monotonic time of the message that said it

    @classmethod
    def from_wire(cls, w: dict, now: float | None = None) -> "WorkerRow":
        pool = w.get("pool") or {}
        uptime = w.get("uptime_s")
        return cls(w["name"], w["role"], w["state"], w.get("pid"), w.get("device"), pool.get("name") or w["name"],
                   pool.get("pages"), pool.get("used_pages"), int(w.get("inflight") or 0), w.get("reason") or "",
                   int(w.get("restarts") or 0), _number(uptime, None),
                   time.monotonic() if now is None else now)

    def age_s(self, now: float | None = None) -> float | None:
        """Seconds since this worker's process started (None: not known, or not running)."""
        if self.uptime_s is None or not self.running:
            return None
        now = time.monotonic() if now is None else now
        return self.uptime_s + max(0.0, now - (self.seen_at or now))

    @property
    def running(self) -> bool:
        """Its process is up (its pool's pages are live)."""
        return self.state in WORKER_UP


@dataclass
class RequestRow:
    request_id: str
    slot: int
    tenant: str
    prompt_len: int
    phase: str
    pages: dict[str, int] = field(default_factory=dict)
    ttft_ms: float | None = None
    tokens: int = 0
    finish_reason: str | None = None
    error: dict | None = None
    updated: float = 0.0
    arrival: float | None = None  # engine wall clock
    timeline: list[tuple[str, float]] = field(default_factory=list)  # (phase, engine wall time it began)
    first_token_at: float | None = None  # engine wall clock

    @property
    def done(self) -> bool:
        return self.phase in END_PHASES

    def note_phase(self, phase: str, at: float) -> None:
        """The phase as seen at engine time `at`: a new entry when it changed (bounded)."""
        if not self.timeline or self.timeline[-1][0] != phase:
            if len(self.timeline) >= MAX_TIMELINE:
                del self.timeline[1]  # keep the arrival
            self.timeline.append((phase, at))


def _another_run(before: tuple, now: tuple) -> bool:
    """(control, started, run) of two status replies: another engine run answers now. A
    field one of them lacks (a brief status, an engine without a journal) proves nothing."""
    return any(a is not None and b is not None and a != b for a, b in zip(before, now))


def _number(value, default):
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


class EngineState:
    def __init__(self):
        self.pages = PageMirror()
        self.history = PageHistory()  # the page maps of the last minutes (record_history)
        self.find = Find()  # what the find box asks for: tables and maps show what matches
        self.requests: OrderedDict[str, RequestRow] = OrderedDict()
        self.request_of_slot: dict[int, str] = {}
        self.alerts: OrderedDict[str, AlertRow] = OrderedDict()
        self.new_alerts: list[AlertRow] = []  # newly firing since the window last looked
        self.crossings = CrossingWatch()  # data that crossed between requests (status)
        self.new_crossings: list[Crossing] = []  # pairs not announced yet
        self.workers: list[WorkerRow] = []
        self.capacity: list[dict] = []
        self.metrics: dict[str, deque] = {name: deque() for name in METRIC_SERIES}
        self.pool_usage: dict[str, deque] = {}
        self.engine: dict = {}  # from status: endpoints, model, version
        self.engine_epoch: tuple | None = None  # (control endpoint, start time, journal run) of the engine answering
        self.run_number = 0  # engine runs seen by this window, less one: a restart adds one
        self.restarts: deque[RestartMark] = deque(maxlen=MAX_RESTARTS)
        self.rewind_to: float | None = None  # wall time the history shows (None: live)
        self.config: dict = {}
        self.last_message_at: float | None = None
        self.messages = 0
        self.stale: bool | None = None  # as last shown (check_stale); None before the first check
        self.topics = TopicLog()  # every topic's latest payload, known or not
        self.events = Events(*EVENTS, families=(TOPIC_EVENT_PREFIX,))
        self.selection = Selection(self.events.selection)

    # ---- selection ------------------------------------------------------------------------
    @property
    def selected_request(self) -> str | None:
        return self.selection.request_id

    @selected_request.setter
    def selected_request(self, request_id: str | None) -> None:
        self.select_request(request_id)

    def select_request(self, request_id: str | None) -> bool:
        """Select a request by id (None or "" clears); its slot when the request is known.
        True if the selection changed."""
        row = self.requests.get(request_id) if request_id else None
        return self.selection.select(request_id, row.slot if row else None)

    def select_slot(self, slot: int | None) -> bool:
        """Select the pages of a slot (None clears), and its request when it is known."""
        row = self.request_for_slot(slot) if slot is not None else None
        return self.selection.select(row.request_id if row else None, slot)

    # ---- folding messages in ----------------------------------------------------------
    def apply(self, msg: Message, now: float | None = None) -> set[str]:
        """Fold one telemetry message in; returns the parts that changed."""
        now = time.monotonic() if now is None else now
        self.last_message_at = now
        self.messages += 1
        topic = msg.topic or ""
        changed = {topic_event(topic), "topics"} if topic and self.topics.store(topic, msg.header, now, time.time()) \
            else set()
        if topic.startswith(PAGES_PREFIX):
            if self.pages.apply(msg):
                changed.add("pages")
        else:
            handler = getattr(self, f"_on_{topic}", None)
            if handler is not None:
                handler(msg, now)
                changed.add(topic)
        self.events.mark(*changed)
        return changed

    def apply_status(self, status: dict, now: float | None = None) -> set[str]:
        """A status reply: workers, capacity findings, engine facts, config. A restart of the
        engine (another start time or journal run) retires the alerts so far and marks it."""
        now = time.monotonic() if now is None else now
        engine = status.get("engine") or {}
        evidence = status.get("evidence")
        run = evidence.get("run") if isinstance(evidence, dict) else None
        epoch = (engine.get("control"), engine.get("started"), run)
        if engine.get("started") is not None or run is not None:
            before = self.engine_epoch
            if before is not None and _another_run(before, epoch):
                uptime = _number(engine.get("uptime_s"), None)
                began = now - uptime if uptime is not None and uptime >= 0 else now  # on this window's clock
                self._restarted(began, before[1], engine.get("started"))
                self.engine_epoch = epoch
            else:  # the same run: keep what an earlier reply said and this one leaves out
                self.engine_epoch = tuple(b if b is not None else a for a, b in zip(before or (None,) * 3, epoch))
        self.engine = status.get("engine", self.engine)
        self.config = status.get("config", self.config)  # a brief status leaves it out
        # a `workers` or `capacity` message published before this reply (still on its way,
        # late under load) is older than what the reply says: _older_than_status() drops it;
        # and the other way round, a reply made before a message this window already applied
        # (the two come on different sockets) must not put the older state back
        seqs = status.get("telemetry_seq")
        self._status_seq = {k: v for k, v in seqs.items() if isinstance(v, int)} if isinstance(seqs, dict) else {}
        applied = getattr(self, "_topic_seq", {})
        if not self._status_older_than_topic("workers", applied):
            self.workers = [WorkerRow.from_wire(w, now) for w in status.get("workers", [])]
        if not self._status_older_than_topic("capacity", applied):
            self.capacity = list(status.get("capacity", []))
        changed = {"workers", "capacity", "engine"}
        if "crossings" in status:
            self.new_crossings += self.crossings.update(status["crossings"], engine_epoch=self.run_number)
            changed.add("crossings")
        self.events.mark(*changed)
        return changed

    def _restarted(self, began: float, previous_started: float | None, started: float | None) -> None:
        """The engine answering now is another run: the alerts so far are the previous
        engine's, a marker row says when, and the plots get a mark (the crossings the operator
        has not acknowledged stay: see CrossingWatch)."""
        self.run_number += 1
        self._status_seq = {}  # the new engine counts its topics from 1 again
        self._topic_seq = {}
        self._retire_alerts()
        wall = time.time()
        marker = restart_marker(self.run_number, wall, previous_started, started)
        self.alerts[marker.id] = marker
        self.restarts.append(RestartMark(began, wall, started))
        self.events.mark("alerts", "metrics")

    def _retire_alerts(self) -> None:
        """Another engine answers now: the alerts so far stay, marked as the previous
        engine's, under ids of their own (the new engine's ids may be the same strings)."""
        retired = OrderedDict()
        for aid, row in self.alerts.items():
            if not row.previous_engine and not row.marker:
                aid = f"previous:{aid}"
                row = replace(row, id=aid, previous_engine=True)
            retired[aid] = row
        self.alerts = retired
        self.new_alerts = []
        self.events.mark("alerts")

    def workers_with_live_usage(self) -> list[WorkerRow]:
        """The workers, each pool's used pages counted from the page map's own mirror where
        it has one (the heartbeat's figure lags it: the map and the panel must agree)."""
        rows = []
        for w in self.workers:
            mirror = self.pages.pools.get(w.pool)
            if mirror is not None and w.running:
                w = replace(w, used_pages=int(np.count_nonzero(mirror.arrays["state"] != PageState.FREE)))
            rows.append(w)
        return rows

    def current_alerts(self) -> list[AlertRow]:
        """Alerts of the engine answering now (not of a previous one, not a marker)."""
        return [a for a in self.alerts.values() if not a.previous_engine and not a.marker]

    def firing_critical(self) -> int:
        """Critical alerts firing on the engine answering now."""
        return sum(1 for a in self.alerts.values() if a.live_firing and a.severity == "critical")

    def _older_than_status(self, msg: Message, topic: str) -> bool:
        seq = msg.get("seq")
        return isinstance(seq, int) and seq <= getattr(self, "_status_seq", {}).get(topic, 0)

    def _status_older_than_topic(self, topic: str, applied: dict[str, int]) -> bool:
        said = self._status_seq.get(topic)
        return said is not None and topic in applied and said < applied[topic]

    def _applied(self, msg: Message, topic: str) -> None:
        seq = msg.get("seq")
        if isinstance(seq, int):
            if not hasattr(self, "_topic_seq"):
                self._topic_seq: dict[str, int] = {}
            self._topic_seq[topic] = seq

    def _on_workers(self, msg: Message, now: float) -> None:
        if not self._older_than_status(msg, "workers"):
            self.workers = [WorkerRow.from_wire(w, now) for w in msg.get("workers", [])]
            self._applied(msg, "workers")

    def _on_capacity(self, msg: Message, now: float) -> None:
        if not self._older_than_status(msg, "capacity"):
            self.capacity = list(msg.get("findings", []))
            self._applied(msg, "capacity")

    def _on_metrics(self, msg: Message, now: float) -> None:
        for name in METRIC_SERIES:
            value = msg.get(name)
            if value is not None:
                self.metrics[name].append((now, float(value)))
        for pool, usage in (msg.get("pools") or {}).items():
            series = self.pool_usage.setdefault(pool, deque())
            pages = usage.get("pages") or 0
            series.append((now, 100.0 * (usage.get("used_pages") or 0) / pages if pages else 0.0))
        for series in (*self.metrics.values(), *self.pool_usage.values()):
            while series and now - series[0][0] > METRIC_WINDOW_S:
                series.popleft()

    def _on_requests(self, msg: Message, now: float) -> None:
        rid = msg.get("request_id")
        if not isinstance(rid, str):
            return
        row = self.requests.get(rid)
        ttft = msg.get("ttft_s")
        fields = dict(
            slot=int(msg.get("slot", -1)), tenant=str(msg.get("tenant", "")), prompt_len=int(msg.get("prompt_len", 0)),
            phase=str(msg.get("phase", "")), pages=dict(msg.get("pages") or {}),
            ttft_ms=None if ttft is None else 1e3 * float(ttft), tokens=int(msg.get("tokens") or 0),
            finish_reason=msg.get("finish_reason"), error=msg.get("error"), updated=now,
        )
        if row is None:
            row = self.requests[rid] = RequestRow(rid, **fields)
        else:
            for key, value in fields.items():
                setattr(row, key, value)
            self.requests.move_to_end(rid)
        at = _number(msg.get("time"), time.time())
        if row.arrival is None:
            row.arrival = _number(msg.get("arrival"), at)
            if row.phase != Phase.QUEUED:  # joined late: say when it arrived, not what it did before
                row.note_phase("arrived", row.arrival)
        row.note_phase(row.phase, row.arrival if not row.timeline and row.phase == Phase.QUEUED else at)
        if ttft is not None and row.first_token_at is None:
            row.first_token_at = row.arrival + float(ttft)
        self.request_of_slot[row.slot] = rid
        while len(self.requests) > MAX_REQUESTS:
            old_id, old = next(iter(self.requests.items()))
            if not old.done:
                break  # never drop a live request's row
            self.requests.popitem(last=False)
            self.request_of_slot.pop(old.slot, None)

    def _on_alerts(self, msg: Message, now: float) -> None:
        row = alert_row(msg)
        previous = self.alerts.get(row.id)
        if row.previous_run:  # the engine read it back from its journal: the row this window retired is the same
            self.alerts.pop(f"previous:{row.id}", None)
        self.alerts[row.id] = row
        self.alerts.move_to_end(row.id)
        if row.live_firing and (previous is None or previous.state != AlertState.FIRING):
            self.new_alerts.append(row)
        while len(self.alerts) > MAX_ALERTS:
            self.alerts.popitem(last=False)

    # ---- questions the window asks ----------------------------------------------------
    def is_stale(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        return self.last_message_at is None or now - self.last_message_at > STALE_AFTER_S

    def check_stale(self, now: float | None = None, *, connected: bool = True, live: bool = True) -> bool:
        """Whether what the views show is out of date (a live engine with no telemetry for
        STALE_AFTER_S, or its link down); marks `stale` when the answer changes."""
        stale = live and (self.is_stale(now) or not connected)
        if stale != self.stale:
            self.stale = stale
            self.events.stale.mark()
        return stale

    def telemetry_age(self, now: float | None = None) -> float | None:
        now = time.monotonic() if now is None else now
        return None if self.last_message_at is None else now - self.last_message_at

    def exceeding_findings(self) -> list[dict]:
        return [f for f in self.capacity if f.get("exceeds")]

    def request_for_slot(self, slot: int) -> RequestRow | None:
        rid = self.request_of_slot.get(int(slot))
        return self.requests.get(rid) if rid else None

    def tenant_of_slot(self, slot: int) -> str | None:
        row = self.request_for_slot(slot)
        return row.tenant if row else None

    def set_find(self, text: str) -> bool:
        """Find a request or tenant across the views ("" shows everything); marks find."""
        if text == self.find.text:
            return False
        self.find = Find(text)
        self.events.mark("find")
        return True

    def tenant_of_request(self, request_id: str) -> str | None:
        row = self.requests.get(request_id)
        return row.tenant if row else None

    def record_history(self, wall_time: float | None = None) -> bool:
        """Add the page maps as they are now to the history (if a page changed); marks
        history. The window calls this every frame; the history keeps its own pace."""
        def owner(slot: int):
            row = self.request_for_slot(slot)
            return (row.request_id, row.tenant) if row else None
        added = self.history.record(self.pages, owner, time.time() if wall_time is None else wall_time)
        if added:
            self.events.mark("history")
        return added

    def set_rewind(self, wall_time: float | None) -> bool:
        """The history shows wall time `wall_time` (None: live); the views that rewind follow
        event rewind."""
        if wall_time == self.rewind_to:
            return False
        self.rewind_to = wall_time
        self.events.mark("rewind")
        return True

    def take_new_crossings(self) -> list[Crossing]:
        new, self.new_crossings = self.new_crossings, []
        return new

    def take_new_alerts(self) -> list[AlertRow]:
        new, self.new_alerts = self.new_alerts, []
        return new
