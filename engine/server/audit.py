"""AuditLog: what happened to each request, in order, for tests and incident scoping.

Bounded three ways, because an incident is exactly when it fills up (one reader
collected 672 events, 1.4 MB, and a three-wave incident made a 154 MB `history` answer):
- at most `max_requests` subjects (the oldest subject goes first);
- an event that repeats (alerts, cross reads, ownership violations) is recorded once per
  (event, role, prevented, pool): later ones raise its `repeated` count and `last_time`
  and add to `<list field>_total`;
- a list field keeps its first MAX_LIST items (its length is in `<field>_total`), and a
  subject keeps at most MAX_EVENTS events (the rest are counted in `elided`).
Every subject gets a sequence number when it is first seen: `since(..., after=seq)` pages
through the log in that order, so an answer never has to hold all of it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# In memory: the newest requests only. The evidence journal keeps every event of every request
# (engine/evidence); 100,000 here held ~85 MB of dicts that only grew for hours under load.
MAX_REQUESTS = 10_000
MAX_EVENTS = 256  # per subject
MAX_LIST = 16  # items kept of one list field
REPEATING = ("alert:", "cross_read", "ownership_violation")  # prefixes of events merged when repeated

Event = dict[str, Any]  # {"event", "time", **fields}: what `events` and `since` answer with
MergeKey = tuple[str, object, object, object]  # (event, role, prevented, pool)
Sink = Callable[[str, str, float, dict[str, Any]], None]  # (subject, event, time, fields)


@dataclass
class _Subject:
    seq: int
    events: list[Event] = field(default_factory=list)
    merged: dict[MergeKey, int] = field(default_factory=dict)  # merge key -> index in events
    elided: int = 0
    latest: float = 0.0  # the time of its newest event kept (a merged repeat counts)

    def listing(self) -> list[Event]:
        out = list(self.events)
        if self.elided:
            out.append({"event": "elided", "time": out[-1]["time"] if out else 0.0, "count": self.elided,
                        "message": f"{self.elided:,} more events were not kept (at most {MAX_EVENTS} per request)"})
        return out


def _bounded(fields: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in fields.items():
        if isinstance(value, (list, tuple)) and len(value) > MAX_LIST:
            out[key], out[f"{key}_total"] = list(value[:MAX_LIST]), len(value)
        else:
            out[key] = value
    return out


class AuditLog:
    def __init__(self, max_requests: int = MAX_REQUESTS, sink: Sink | None = None) -> None:
        """sink(subject, event, time, fields): every event as it is recorded, before merging and
        the per-subject cap (the evidence journal keeps what memory cannot); repeats merged into
        an earlier event are not passed again (the journal has the crossings and alerts whole)."""
        self.max_requests = max_requests
        self.sink = sink
        self._subjects: OrderedDict[str, _Subject] = OrderedDict()
        self._next_seq = 1
        self.forgotten = 0  # subjects dropped from memory (the journal has them)
        self.forgotten_until = 0.0  # the newest event time among them: a window reaching before it is partial here

    def record(self, request_id: str, event: str, **fields: Any) -> None:
        subject = self._subjects.get(request_id)
        if subject is None:
            subject = self._subjects[request_id] = _Subject(self._next_seq)
            self._next_seq += 1
            if len(self._subjects) > self.max_requests:
                _, gone = self._subjects.popitem(last=False)  # forget the oldest request
                self.forgotten += 1
                self.forgotten_until = max(self.forgotten_until, gone.latest)
        now = time.time()
        key: MergeKey | None = None
        if event.startswith(REPEATING):
            key = (event, fields.get("role"), fields.get("prevented"), fields.get("pool"))
            index = subject.merged.get(key)
            if index is not None:
                first = subject.events[index]
                first["repeated"] = first.get("repeated", 1) + 1
                first["last_time"] = subject.latest = now
                for name, value in fields.items():
                    if isinstance(value, (list, tuple)):
                        total = f"{name}_total"
                        first[total] = first.get(total, len(first.get(name) or [])) + len(value)
                return
        if self.sink is not None:
            self.sink(request_id, event, now, fields)
        if len(subject.events) >= MAX_EVENTS:
            subject.elided += 1
            return
        if key is not None:
            subject.merged[key] = len(subject.events)
        subject.events.append({"event": event, "time": now, **_bounded(fields)})
        subject.latest = now

    def events(self, request_id: str) -> list[Event]:
        subject = self._subjects.get(request_id)
        return subject.listing() if subject is not None else []

    def __len__(self) -> int:
        return len(self._subjects)

    def since(self, since: float, *, after: int = 0, limit: int | None = None) -> list[tuple[str, list[Event], int]]:
        """(subject, events, seq) of subjects with an event at or after `since`, in the order
        they were first seen, starting after sequence number `after`; at most `limit`."""
        out: list[tuple[str, list[Event], int]] = []
        for rid, subject in self._subjects.items():
            if subject.seq > after and subject.latest >= since:
                out.append((rid, subject.listing(), subject.seq))
                if limit is not None and len(out) >= limit:
                    break
        return out
