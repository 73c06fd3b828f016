"""An EngineState filled from an opened snapshot bundle, as if the engine had sent it.

Qt-free. Each part goes through the same paths live telemetry takes (status, `requests`,
`alerts` and `metrics` messages, a page keyframe per pool), so the views show a bundle
exactly as they show an engine. A part the bundle holds in a wrong shape is skipped and
named in `problems`; nothing here raises on bad content.
"""

from __future__ import annotations

import time

from engine.wire.protocol import Message
from engine.wire.states import pages_topic
from gui.model.engine_state import EngineState


def state_from_snapshot(opened) -> tuple[EngineState, list[str]]:
    """(state, problems) for an OpenedSnapshot (gui.snapshot.bundle)."""
    snap, state, problems = opened.state, EngineState(), []
    try:
        state.apply_status({"engine": _dict(snap.get("engine")), "config": _dict(opened.manifest.get("config")),
                            "workers": _list(snap.get("workers")), "capacity": _list(snap.get("capacity"))})
    except Exception as exc:  # noqa: BLE001 - any shape a bundle can hold: named, then left out
        problems.append(f"status (engine, config, workers, capacity) is malformed and left out: "
                        f"{type(exc).__name__}: {exc}")
    now = time.monotonic()
    for record in _list(snap.get("requests")):
        _fold(state, "requests", record, now, problems)
    for record in _list(snap.get("alerts")):
        _fold(state, "alerts", record, now, problems)
    state.new_alerts.clear()  # a bundle's alerts are history, not news
    metrics = [e for e in opened.events if e.get("topic") == "metrics" and isinstance(e.get("time"), (int, float))]
    if metrics:
        last = metrics[-1]["time"]
        for event in metrics:  # on the window's clock: the newest sample is "now"
            _fold(state, "metrics", event, now - (last - event["time"]), problems)
    pools = {p.get("name"): p for p in _list(snap.get("pools")) if isinstance(p, dict)}
    for name, arrays in opened.pages.items():
        pool = pools.get(name, {})
        try:
            header = {"topic": pages_topic(name), "pool": name, "kind": "keyframe", "seq": 0,
                      "num_pages": len(arrays["owner"]), "role": str(pool.get("role", "")),
                      "page_size": int(pool.get("page_size") or 0)}
            state.pages.apply(Message(header, dict(arrays)))
        except Exception as exc:  # noqa: BLE001 - a damaged pool is named and left out
            problems.append(f"pool {name}: {type(exc).__name__}: {exc}")
    state.last_message_at = now
    return state, problems


def scope_pairs(opened, since: float, until: float) -> list[dict]:
    """The bundle's affected pairs whose reads overlap [since, until]."""
    pairs = _list(_dict(opened.state.get("scope")).get("pairs"))
    return [p for p in pairs if isinstance(p, dict) and p.get("last", 0) >= since and p.get("first", 0) <= until]


def _fold(state: EngineState, topic: str, record, now: float, problems: list[str]) -> None:
    if not isinstance(record, dict):
        problems.append(f"a {topic} record is {type(record).__name__}, not an object")
        return
    try:
        state.apply(Message({**record, "topic": topic}), now)
    except Exception as exc:  # noqa: BLE001 - a malformed record is named and skipped
        name = record.get("request_id") or record.get("id")
        problems.append(f"{topic} record {str(name)[:80]}: {type(exc).__name__}: {exc}")


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def _list(value) -> list:
    return value if isinstance(value, list) else []
