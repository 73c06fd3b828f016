"""The requests as they were at a moment of the history, and which of them data crossed (Qt-free).

The history slider shows the page maps of a past moment; the requests table goes back with
them: only the requests that had arrived by then, each in the phase it was in (its timeline,
as the engine stamped it), with a time to first token only if the first token had come. The
requests whose data crossed by then are marked: a reader received another request's data,
a source's data went to another request (the crossings the engine listed), or a detector's
alert named it.
"""

from __future__ import annotations

from dataclasses import replace

from engine.wire.alert_kinds import DETECTORS


def phase_at(row, t: float) -> str | None:
    """The phase `row` (a RequestRow) was in at wall time t; None before it arrived."""
    if row.arrival is None or row.arrival > t:
        return None
    phase = None
    for name, began in row.timeline:
        if began > t:
            break
        phase = name
    return phase or (row.timeline[0][0] if row.timeline else row.phase)


def requests_at(rows, t: float | None) -> list:
    """The rows as at wall time t (None: as now). A row that changed since is a copy; one
    that did not is the row itself (the table repaints only what moved)."""
    if t is None:
        return list(rows)
    out = []
    for row in rows:
        phase = phase_at(row, t)
        if phase is None:
            continue
        ttft = row.ttft_ms if row.first_token_at is not None and row.first_token_at <= t else None
        out.append(row if (phase, ttft) == (row.phase, row.ttft_ms) else replace(row, phase=phase, ttft_ms=ttft))
    return out


def affected_at(crossings, alerts, t: float | None) -> dict[str, str]:
    """request id -> why it is marked, for the data that had crossed by wall time t (None: by
    now): `crossings` are Crossing records, `alerts` AlertRows."""
    why: dict[str, str] = {}
    for c in crossings:
        if t is not None and c.time > t:
            continue
        if c.reader:
            why[c.reader] = f"received data of {c.source or 'an unknown request'}"
        if c.source:
            why.setdefault(c.source, f"its data went to {c.reader or 'an unknown request'}")
    for alert in alerts:
        # an alert's list is not stamped per request: only one that ended by t proves its names;
        # one whose every event was stopped (a transfer refused, recomputed) names no crossing
        if alert.kind in DETECTORS and alert.prevented is not True and (t is None or alert.last_seen <= t):
            for rid in alert.requests:
                why.setdefault(rid, f"named by the {alert.kind} alert")
    return why
