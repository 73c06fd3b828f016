"""AlertBook: the engine's alerts with a lifecycle: pending -> firing -> resolved, plus
acknowledgement. Every change is published on the `alerts` topic as the whole record.

Condition alerts (capacity, a crashed or unresponsive worker) resolve when the condition
clears. Incident alerts (a transfer mismatch, a late write, an ownership violation, an
admission rejection) aggregate per kind and subject and resolve after a quiet minute;
they stay in the record, acknowledged or not.

An alert that comes back after it resolved is a new *episode*: a new record under the same `id`
with the next `episode` number and its own `key` (`id#episode`). The earlier episode is kept
whole (`past`), never overwritten: an incident review needs every wave. Records of an earlier
engine run (read back from the evidence journal) are kept beside them, marked `previous_run`.
Each record's `requests` / `pages` lists keep the newest MAX_LISTED; `requests_total` /
`pages_total` count every distinct one the episode named, so a reader can say "+N more".
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from engine.wire.alert_kinds import ISOLATION_KINDS, SEVERITIES, alert_kind, check_severity
from engine.wire.states import AlertState

QUIET_RESOLVE_S = 60.0
MAX_ALERTS = 1_000  # past this, the lowest-severity, oldest alerts go first
MAX_PROTECTED = 10_000  # critical isolation alerts are evicted only past this many of them
REPUBLISH_S = 1.0  # an alert firing again and again is published at most this often
MAX_LISTED = 50  # requests / pages kept per alert
MAX_TRANSITIONS = 50  # state changes kept per alert (snapshots show them)
MAX_PAST = 2_000  # ended episodes kept in memory (the journal keeps them all); past it the oldest go, counted
MAX_DISTINCT = 1_000_000  # distinct requests / pages counted per episode; past it the totals are lower bounds

Record = dict[str, Any]  # one alert episode as it goes on the wire and into the journal
Listener = Callable[[Record], None]
_T = TypeVar("_T")


class AlertBook:
    def __init__(self, publish: Listener, changed: Listener | None = None) -> None:
        """publish(record: dict) sends one alert record on the telemetry topic (a repeat at most
        every REPUBLISH_S); changed(record), when given, hears of every change at once, unthrottled
        (the evidence journal: a crash must not lose a second of counts)."""
        self.publish = publish
        self.changed: Listener = changed or (lambda record: None)
        self.alerts: OrderedDict[str, Record] = OrderedDict()
        self.conditions: set[str] = set()  # ids that resolve on a condition, not on quiet
        self.evicted = 0
        self.past: deque[Record] = deque()  # ended episodes, oldest first
        self.past_evicted = 0
        self.previous: list[Record] = []  # episodes of earlier engine runs (from the journal), read-only
        self._episodes: dict[str, int] = {}  # alert id -> its newest episode number
        self.fired: Counter[str] = Counter()  # kind -> episodes that fired (from their first firing), this run
        self.events: Counter[str] = Counter()  # kind -> events raised firing (every fire), this run
        self._distinct: dict[str, tuple[set[str], set[int]]] = {}  # alert id -> (requests, pages) of the live episode
        self._published: dict[str, float] = {}  # alert id -> when it was last published
        self._held: set[str] = set()  # repeats not yet published (flush() sends them)

    def fire(self, kind: str, severity: str, detail: str, *, subject: str = "", condition: bool = False,
             requests: Iterable[str] = (), pages: Iterable[int] = (), **fields: Any) -> Record:
        return self._set(AlertState.FIRING, kind, severity, detail, subject, condition, requests, pages, fields)

    def pending(self, kind: str, severity: str, detail: str, *, subject: str = "", **fields: Any) -> Record:
        return self._set(AlertState.PENDING, kind, severity, detail, subject, True, (), (), fields)

    def resolve(self, kind: str, subject: str = "") -> None:
        record = self.alerts.get(_alert_id(kind, subject))
        if record is not None and record["state"] != AlertState.RESOLVED:
            record["state"], record["resolved_at"] = AlertState.RESOLVED, time.time()
            _transition(record, AlertState.RESOLVED, record["resolved_at"])
            self.changed(record)
            self.publish(dict(record))

    def acknowledge(self, ids: list[str]) -> list[str]:
        """Mark alerts acknowledged, by id (its live episode) or by key (any episode, of this
        run or an earlier one); returns the ids and keys that exist."""
        done: list[str] = []
        by_key: dict[str, Record] | None = None
        for aid in ids:
            record = self.alerts.get(aid)
            if record is None:
                if by_key is None:
                    by_key = {r["key"]: r for r in (*self.previous, *self.past, *self.alerts.values())}
                record = by_key.get(aid)
            if record is not None:
                if not record["acked"]:
                    record["acked"] = True
                    _transition(record, "acknowledged", time.time())
                    self.changed(record)
                    self.publish(dict(record))
                done.append(aid)
        return done

    def expire(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        self.flush(now)
        for aid, record in self.alerts.items():
            if (aid not in self.conditions and record["state"] == AlertState.FIRING
                    and now - record["last_seen"] > QUIET_RESOLVE_S):
                record["state"], record["resolved_at"] = AlertState.RESOLVED, now
                _transition(record, AlertState.RESOLVED, now)
                self.changed(record)
                self.publish(dict(record))

    def records(self) -> list[Record]:
        """Every episode kept: earlier runs', then this run's ended ones, then the live ones."""
        return [dict(r) for r in (*self.previous, *self.past, *self.alerts.values())]

    def live(self) -> list[Record]:
        """The newest episode of each alert of this run."""
        return [dict(r) for r in self.alerts.values()]

    def add_previous(self, records: list[Record], left_out: int = 0) -> None:
        """Episodes of an earlier engine run, read back from the journal: shown, never changed
        (acknowledging one is the only edit) and never forwarded again. Their key names their run
        (`run/id#episode`: episode numbers start again in every run); `journal_key` is the key
        the journal keeps them under. left_out: older ones not read back (the journal has them)."""
        self.previous = [{**r, "previous_run": True, "journal_key": r["key"], "key": f"{r['run']}/{r['key']}"}
                         for r in records]
        self.previous_left_out = left_out

    def counts(self) -> dict[str, int]:
        """What the records leave out, so that a reader can say so."""
        return {"live": len(self.alerts), "past": len(self.past), "past_left_out": self.past_evicted,
                "evicted": self.evicted, "previous": len(self.previous),
                "previous_left_out": getattr(self, "previous_left_out", 0)}

    def _set(self, state: AlertState, kind: str, severity: str, detail: str, subject: str, condition: bool,
             requests: Iterable[str], pages: Iterable[int], fields: dict[str, Any]) -> Record:
        alert_kind(kind), check_severity(severity)  # a kind or severity not declared is a bug: raise
        aid = _alert_id(kind, subject)
        now = time.time()
        record = self.alerts.get(aid)
        if record is None or (record["state"] == AlertState.RESOLVED and state != AlertState.RESOLVED):
            # a new episode: a resolved alert that comes back needs a fresh look; the one it
            # follows is kept whole
            if record is not None:
                self._end_episode(aid, record)
            episode = self._episodes.get(aid, 0) + 1
            self._episodes[aid] = episode
            record = {"id": aid, "key": f"{aid}#{episode}", "episode": episode, "kind": kind, "subject": subject,
                      "first_seen": now, "count": 0, "acked": False, "requests": [], "pages": [],
                      "requests_total": 0, "pages_total": 0, "transitions": []}
            self.alerts[aid] = record
            self._distinct[aid] = (set(), set())
        changed = record.get("state") != state or record.get("severity") != severity
        if record.get("state") != state:
            _transition(record, state, now)
        self.alerts.move_to_end(aid)
        if "prevented" in fields:  # one event that got through makes the episode "not prevented" for good
            prevented = bool(fields.pop("prevented"))
            record["prevented"] = record.get("prevented", True) and prevented
            counts = dict(record.get("prevented_counts") or {"prevented": 0, "not_prevented": 0})
            counts["prevented" if prevented else "not_prevented"] += 1
            record["prevented_counts"] = counts  # a new dict: the journal's writer may be reading the old one
        record.update(fields)
        record.update(state=state, severity=severity, detail=detail, last_seen=now)
        record["count"] += state == AlertState.FIRING
        self.events[kind] += state == AlertState.FIRING
        if state == AlertState.FIRING and record["count"] == 1:
            self.fired[kind] += 1  # an episode, counted once however many events it gathers
        requests, pages = [str(r) for r in requests], [int(p) for p in pages]
        record["requests"] = _bounded(record["requests"], requests)
        record["pages"] = _bounded(record["pages"], pages)
        seen_requests, seen_pages = self._distinct.setdefault(aid, (set(), set()))
        record["requests_total"] = _count(seen_requests, requests, record["requests_total"])
        record["pages_total"] = _count(seen_pages, pages, record["pages_total"])
        if condition:
            self.conditions.add(aid)
        self.changed(record)
        while len(self.alerts) > MAX_ALERTS and self._evict_one():
            pass
        if changed or now - self._published.get(aid, 0.0) >= REPUBLISH_S:
            self._send(aid, now)
        else:
            self._held.add(aid)  # the same alert again within a second: sent by flush()
        return record

    def flush(self, now: float | None = None) -> None:
        """Publish the held repeats whose REPUBLISH_S has passed."""
        now = time.time() if now is None else now
        for aid in [a for a in self._held if now - self._published.get(a, 0.0) >= REPUBLISH_S]:
            self._send(aid, now)

    def _send(self, aid: str, now: float) -> None:
        self._held.discard(aid)
        record = self.alerts.get(aid)
        if record is not None:
            self._published[aid] = now
            self.publish(dict(record))

    def _evict_one(self) -> bool:
        """Forget one alert: the oldest of the lowest severity, never a critical isolation
        alert while others remain (a flood of errors must not push out the evidence), and
        of those only past MAX_PROTECTED, resolved ones first. False when nothing may go."""
        unprotected = [(SEVERITIES.index(r["severity"]), i, aid) for i, (aid, r) in enumerate(self.alerts.items())
                       if not _protected(r)]
        if unprotected:
            victim = min(unprotected)[2]
        elif len(self.alerts) > MAX_PROTECTED:
            victim = min(self.alerts, key=lambda a: self.alerts[a]["state"] != AlertState.RESOLVED)  # oldest first
        else:
            return False
        del self.alerts[victim]  # the journal keeps it; memory keeps the evidence that matters
        self._distinct.pop(victim, None)
        self.conditions.discard(victim)
        self._held.discard(victim)
        self._published.pop(victim, None)
        self.evicted += 1
        return True


    def _end_episode(self, aid: str, record: Record) -> None:
        """Keep an ended episode whole in `past`; past MAX_PAST the oldest go,
        counted (the journal still holds them)."""
        self._distinct.pop(aid, None)
        self.past.append(record)
        while len(self.past) > MAX_PAST:
            self.past.popleft()
            self.past_evicted += 1


def _count(seen: set[_T], new: list[_T], total: int) -> int:
    """Distinct items ever named: exact while `seen` is under MAX_DISTINCT, then it only grows
    by the new items that were not among the remembered ones (a lower bound)."""
    before = len(seen)
    if before < MAX_DISTINCT:
        seen.update(new)
        return total + len(seen) - before
    return total + sum(1 for item in new if item not in seen)


def _protected(record: Record) -> bool:
    return record["kind"] in ISOLATION_KINDS and record["severity"] == "critical"


def _transition(record: Record, state: str, when: float) -> None:
    record["transitions"] = [*record["transitions"], [state, when]][-MAX_TRANSITIONS:]


def _alert_id(kind: str, subject: str) -> str:
    return f"{kind}:{subject}" if subject else kind


def _bounded(old: list[_T], new: list[_T]) -> list[_T]:
    merged = list(dict.fromkeys([*old, *new]))
    return merged[-MAX_LISTED:]
