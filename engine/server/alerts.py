"""AlertBook: the engine's alerts with a lifecycle: pending -> firing -> resolved, plus
acknowledgement. Every change is published on the `alerts` topic as the whole record.

Condition alerts (capacity, a crashed or unresponsive worker) resolve when the condition
clears. Incident alerts (a transfer mismatch, a late write, an ownership violation, an
admission rejection) aggregate per kind and subject and resolve after a quiet minute;
they stay in the record, acknowledged or not.
"""

from __future__ import annotations

import time
from collections import OrderedDict

from engine.wire.alert_kinds import alert_kind, check_severity

QUIET_RESOLVE_S = 60.0
MAX_ALERTS = 1_000
MAX_LISTED = 50  # requests / pages kept per alert
MAX_TRANSITIONS = 50  # state changes kept per alert (snapshots show them)


class AlertBook:
    def __init__(self, publish):
        """publish(record: dict) sends one alert record on the telemetry topic."""
        self.publish = publish
        self.alerts: OrderedDict[str, dict] = OrderedDict()
        self.conditions: set[str] = set()  # ids that resolve on a condition, not on quiet

    def fire(self, kind: str, severity: str, detail: str, *, subject: str = "", condition: bool = False,
             requests=(), pages=(), **fields) -> dict:
        return self._set("firing", kind, severity, detail, subject, condition, requests, pages, fields)

    def pending(self, kind: str, severity: str, detail: str, *, subject: str = "", **fields) -> dict:
        return self._set("pending", kind, severity, detail, subject, True, (), (), fields)

    def resolve(self, kind: str, subject: str = "") -> None:
        record = self.alerts.get(_alert_id(kind, subject))
        if record is not None and record["state"] != "resolved":
            record["state"], record["resolved_at"] = "resolved", time.time()
            _transition(record, "resolved", record["resolved_at"])
            self.publish(dict(record))

    def acknowledge(self, ids: list[str]) -> list[str]:
        """Mark alerts acknowledged; returns the ids that exist."""
        done = []
        for aid in ids:
            record = self.alerts.get(aid)
            if record is not None:
                if not record["acked"]:
                    record["acked"] = True
                    _transition(record, "acknowledged", time.time())
                    self.publish(dict(record))
                done.append(aid)
        return done

    def expire(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        for aid, record in self.alerts.items():
            if (aid not in self.conditions and record["state"] == "firing"
                    and now - record["last_seen"] > QUIET_RESOLVE_S):
                record["state"], record["resolved_at"] = "resolved", now
                _transition(record, "resolved", now)
                self.publish(dict(record))

    def records(self) -> list[dict]:
        return [dict(r) for r in self.alerts.values()]

    def _set(self, state, kind, severity, detail, subject, condition, requests, pages, fields) -> dict:
        alert_kind(kind), check_severity(severity)  # a kind or severity not declared is a bug: raise
        aid = _alert_id(kind, subject)
        now = time.time()
        record = self.alerts.get(aid)
        if record is None or (record["state"] == "resolved" and state != "resolved"):
            # a new episode: a resolved alert that comes back needs a fresh look
            record = {"id": aid, "kind": kind, "subject": subject, "first_seen": now, "count": 0,
                      "acked": False, "requests": [], "pages": [], "transitions": []}
            self.alerts[aid] = record
        if record.get("state") != state:
            _transition(record, state, now)
        self.alerts.move_to_end(aid)
        record.update(fields)
        record.update(state=state, severity=severity, detail=detail, last_seen=now)
        record["count"] += state == "firing"
        record["requests"] = _bounded(record["requests"], [str(r) for r in requests])
        record["pages"] = _bounded(record["pages"], [int(p) for p in pages])
        if condition:
            self.conditions.add(aid)
        while len(self.alerts) > MAX_ALERTS:
            old, _ = self.alerts.popitem(last=False)
            self.conditions.discard(old)
        self.publish(dict(record))
        return record


def _transition(record: dict, state: str, when: float) -> None:
    record["transitions"] = [*record["transitions"], [state, when]][-MAX_TRANSITIONS:]


def _alert_id(kind: str, subject: str) -> str:
    return f"{kind}:{subject}" if subject else kind


def _bounded(old: list, new: list) -> list:
    merged = list(dict.fromkeys([*old, *new]))
    return merged[-MAX_LISTED:]
