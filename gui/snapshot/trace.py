"""`trace.json` of an incident snapshot: Chrome Trace Event Format (opens in Perfetto or
chrome://tracing) built from a `state.json` dict (docs/SNAPSHOT.md).

One process, "PageWarden engine", with one track (thread) per worker plus "supervisor" and
"alerts". Each request becomes up to four complete ("X") spans: queue (admitted ->
reserve_sent, supervisor), prefill (prefill_sent -> prefilled, its prefill worker),
transfer (prefilled -> transfer_done) and decode (transfer_done -> its end), both on its
decode worker. Rejections, isolation events, worker events and alert transitions are
instants. Times are microseconds since the window's start, never negative.

Pure Python (no Qt); `request_spans` is shared with the HTML report.
"""

from __future__ import annotations
from engine.wire.states import END_PHASES

PROCESS = "PageWarden engine"
PID = 1
SUPERVISOR, ALERTS = "supervisor", "alerts"
END_EVENTS = END_PHASES
# Request events worth a mark on the timeline of the worker that saw them.
MARKED_EVENTS = ("ownership_violation", "cross_read", "reserve_failed")
_ROLE_ORDER = {"prefill": 0, "decode": 1}


def _first(events: list[dict], names: tuple[str, ...], after: float | None = None) -> dict | None:
    """The first event named one of `names` (at or after `after`, when given)."""
    for event in events:
        if event.get("event") in names and isinstance(event.get("time"), (int, float)):
            if after is None or event["time"] >= after:
                return event
    return None


def request_spans(request: dict) -> list[tuple[str, str | None, float, float]]:
    """(name, worker or None for the supervisor, start, end) of each lifecycle span of a
    request whose two endpoints were recorded; times as recorded (unix seconds)."""
    events = sorted((e for e in request.get("events") or [] if isinstance(e, dict)),
                    key=lambda e: e.get("time") if isinstance(e.get("time"), (int, float)) else 0.0)
    admitted = _first(events, ("admitted",))
    reserve_sent = _first(events, ("reserve_sent",))
    prefill_sent = _first(events, ("prefill_sent",))
    prefilled = _first(events, ("prefilled",))
    transfer_done = _first(events, ("transfer_done",))
    end = _first(events, END_EVENTS, after=transfer_done["time"] if transfer_done else None)
    prefill_worker = ((prefilled or {}).get("worker") or (prefill_sent or {}).get("worker")
                      or request.get("prefill_worker"))
    decode_worker = (transfer_done or {}).get("worker") or request.get("decode_worker")
    spans = []
    for name, worker, start, stop in (
        ("queue", None, admitted, reserve_sent),
        ("prefill", prefill_worker, prefill_sent, prefilled),
        ("transfer", decode_worker, prefilled, transfer_done),
        ("decode", decode_worker, transfer_done, end),
    ):
        if start is not None and stop is not None:
            spans.append((name, worker, float(start["time"]), float(stop["time"])))
    return spans


def _worker_names(state: dict) -> list[str]:
    """Every worker named by the state, listed ones first (prefill, then decode, by name)."""
    listed = sorted((w for w in state.get("workers") or [] if isinstance(w.get("name"), str)),
                    key=lambda w: (_ROLE_ORDER.get(w.get("role"), 2), w["name"]))
    names = [w["name"] for w in listed]
    seen = set(names)
    extra = set()
    for request in state.get("requests") or []:
        extra.update(w for _, w, _, _ in request_spans(request) if w)
        extra.update(e.get("worker") for e in request.get("events") or [] if isinstance(e.get("worker"), str))
    for group in state.get("engine_events") or []:
        subject = str(group.get("subject", ""))
        if subject.startswith("worker:"):
            extra.add(subject.removeprefix("worker:"))
    return names + sorted(extra - seen)


def chrome_trace(state: dict) -> dict:
    """The Chrome trace of a state.json dict: {"traceEvents", "displayTimeUnit", "metadata"}."""
    window = state.get("window") or {}
    since = float(window.get("since") or 0.0)

    def us(t: float) -> float:
        return round(max(0.0, (float(t) - since) * 1e6), 3)

    # stable tids: supervisor 1, workers 10, 11, ... in _worker_names order, alerts 2
    tids = {SUPERVISOR: 1, **{name: 10 + i for i, name in enumerate(_worker_names(state))}, ALERTS: 2}
    meta = [{"ph": "M", "pid": PID, "tid": 0, "name": "process_name", "args": {"name": PROCESS}}]
    for order, (track, tid) in enumerate(tids.items()):
        meta.append({"ph": "M", "pid": PID, "tid": tid, "name": "thread_name", "args": {"name": track}})
        meta.append({"ph": "M", "pid": PID, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": order}})

    def tid_of(worker: str | None) -> int:
        return tids.get(worker, tids[SUPERVISOR]) if worker else tids[SUPERVISOR]

    def instant(name: str, t: float, tid: int, args: dict, scope: str = "t", cat: str = "request") -> dict:
        return {"ph": "i", "s": scope, "name": name, "cat": cat, "pid": PID, "tid": tid, "ts": us(t), "args": args}

    events = []
    for request in state.get("requests") or []:
        rid = str(request.get("request_id"))
        error = request.get("error") if isinstance(request.get("error"), dict) else {}
        args = {"request_id": rid, "tenant": request.get("tenant"), "prompt_len": request.get("prompt_len"),
                "tokens": request.get("tokens"), "finish_reason": request.get("finish_reason")}
        if error:
            args["error"] = error.get("code")
        for name, worker, start, stop in request_spans(request):
            if stop < since:
                continue  # wholly before the window
            events.append({"ph": "X", "name": name, "cat": "request", "pid": PID, "tid": tid_of(worker),
                           "ts": us(start), "dur": round(max(0.0, us(stop) - us(start)), 3), "args": args})
        for event in request.get("events") or []:
            kind, t = event.get("event"), event.get("time")
            if not isinstance(t, (int, float)):
                continue
            if kind == "rejected":
                events.append(instant("rejected", t, tids[SUPERVISOR],
                                      {**args, "code": event.get("code"), "message": event.get("message")}))
            elif kind in MARKED_EVENTS:
                events.append(instant(kind, t, tid_of(event.get("worker") or request.get("decode_worker")),
                                      {"request_id": rid, "pool": event.get("pool"),
                                       "prevented": event.get("prevented")}))
    for group in state.get("engine_events") or []:
        subject = str(group.get("subject", ""))
        worker = subject.removeprefix("worker:") if subject.startswith("worker:") else None
        for event in group.get("events") or []:
            if isinstance(event.get("time"), (int, float)):
                events.append(instant(str(event.get("event")), event["time"], tid_of(worker),
                                      {"subject": subject, "reason": event.get("reason")}, cat="engine"))
    for alert in state.get("alerts") or []:
        args = {"subject": alert.get("subject"), "severity": alert.get("severity"),
                "detail": alert.get("detail"), "requests": list(alert.get("requests") or [])}
        for transition in alert.get("transitions") or []:
            if len(transition) >= 2 and isinstance(transition[1], (int, float)):
                events.append(instant(f"{alert.get('kind')} {transition[0]}", transition[1], tids[ALERTS],
                                      args, scope="g", cat="alert"))
    events.sort(key=lambda e: e["ts"])
    return {
        "traceEvents": meta + events,
        "displayTimeUnit": "ms",
        "metadata": {"generator": "PageWarden incident snapshot", "state_schema": state.get("schema"),
                     "window": {"since": window.get("since"), "until": window.get("until")},
                     "time_origin": "ts is microseconds since window.since (unix seconds)"},
    }
