"""AuditLog: what happened to each request, in order, for tests and incident scoping."""

from __future__ import annotations

import time
from collections import OrderedDict

MAX_REQUESTS = 100_000


class AuditLog:
    def __init__(self, max_requests: int = MAX_REQUESTS):
        self.max_requests = max_requests
        self._events: OrderedDict[str, list[dict]] = OrderedDict()

    def record(self, request_id: str, event: str, **fields) -> None:
        events = self._events.get(request_id)
        if events is None:
            events = self._events[request_id] = []
            if len(self._events) > self.max_requests:
                self._events.popitem(last=False)  # forget the oldest request
        events.append({"event": event, "time": time.time(), **fields})

    def events(self, request_id: str) -> list[dict]:
        return list(self._events.get(request_id, []))

    def __len__(self) -> int:
        return len(self._events)

    def since(self, since: float) -> list[tuple[str, list[dict]]]:
        """(subject, events) of every subject with an event at or after `since`."""
        return [(rid, list(events)) for rid, events in self._events.items() if events[-1]["time"] >= since]
