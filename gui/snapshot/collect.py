"""collect(): everything an incident snapshot holds, asked of a running engine.

Qt-free. The engine answers through its read-only control ops (status, page_metadata,
history, scope, prompt_log), so a `--readonly` window or a CLI with a read-only key can
export. Nothing here ever sees prompt or output text: the engine does not send it.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

import numpy as np

from engine.client import __version__
from engine.wire.states import WorkerState
from gui.snapshot import first_crossing
from gui.snapshot.report import PRIVACY

SCHEMA = "pagewarden.snapshot/1"
STATE_SCHEMA = "pagewarden.snapshot.state/1"


@dataclass
class Snapshot:
    manifest: dict  # without "files": the bundle writer adds them
    state: dict
    pages: dict[str, dict[str, np.ndarray]]  # pool -> owner, epoch, writer, filled, state
    telemetry: list[dict] = field(default_factory=list)  # events.jsonl (and metrics.csv from it)
    # pool -> {"time", "reason", "arrays"}: the pages at the first crossing (first_crossing.py)
    first_crossing: dict[str, dict] = field(default_factory=dict)


def collect(client, *, since: float | None = None, endpoint: str = "", progress=None) -> Snapshot:
    """Ask the engine for the window [since, now] (default: all it keeps) and the pages now.

    progress(fraction, what) is called before each question; it may raise to cancel (the
    export dialog's Cancel does). Raises what the client raises (RemoteError, TimeoutError)
    when the engine cannot answer.
    """
    step = progress or (lambda fraction, what: None)
    step(0.0, "engine status")
    status = client.status()
    engine = status.get("engine", {})
    if since is None:
        since = float(engine.get("time", time.time())) - float(engine.get("uptime_s", 0.0)) - 1.0
    step(0.1, "requests and their events")
    history = client.call("history", since=since)
    requests, engine_events = list(history.get("requests", [])), list(history.get("engine_events", []))
    telemetry = history.get("telemetry", [])  # with the first page only
    keyframes = history.get("keyframes")  # with the first page only; absent from older engines
    if keyframes is None and callable(getattr(client, "keyframes", None)):
        keyframes = client.keyframes(since)  # a journal read offline answers for itself
    while history.get("next"):  # the engine pages a long window: at most ~16 MB an answer
        step(0.1 + 0.4 * (1 - 1 / (1 + len(requests) / 2_000)), f"requests and their events ({len(requests):,} so far)")
        history = client.call("history", since=since, after=int(history["next"]))
        requests += history.get("requests", [])
        engine_events += history.get("engine_events", [])
    step(0.5, "affected pairs")
    scope = client.call("scope", since=since)
    step(0.6, "prompt log")
    prompt_log = client.call("prompt_log", since=since)["entries"]
    pools, pages = [], {}
    workers = status.get("workers", [])
    for i, worker in enumerate(workers):
        pool = worker.get("pool") or {}
        name = pool.get("name")
        if worker.get("state") != WorkerState.READY or not name or name in pages:
            continue
        step(0.7 + 0.3 * i / len(workers), f"pages of {name}")
        pages[name] = client.page_metadata(name)
        pools.append({"name": name, "role": worker.get("role"), "pages": int(pool.get("pages") or 0),
                      "page_size": int(pool.get("page_size") or 0), "worker": worker.get("name")})
    until = float(history.get("until", time.time()))  # the last page's
    crossing, problems = first_crossing.choose(keyframes)
    state = {
        "schema": STATE_SCHEMA,
        "window": {"since": float(since), "until": until},
        "engine": engine,
        "workers": status.get("workers", []),
        "pools": pools,
        "requests": requests,
        "alerts": status.get("alerts", []),
        "capacity": status.get("capacity", []),
        "scope": {"pairs": scope.get("pairs", []), "reads": int(scope.get("reads", 0)),
                  "incomplete_before": scope.get("incomplete_before"),
                  "dropped_reads": int(scope.get("dropped_reads") or 0)},
        "prompt_log": prompt_log,
        "counters": status.get("counters", {}),
        "engine_events": engine_events,
        "first_crossing": first_crossing.describe(keyframes, crossing, problems),
    }
    now = time.time()
    manifest = {
        "schema": SCHEMA,
        "app_version": __version__,
        "engine_version": engine.get("version"),
        "model": engine.get("model"),
        "architecture": engine.get("architecture"),
        "hostnames": {"exporter": socket.gethostname(), "engine": engine.get("hostname")},
        "endpoint": endpoint or engine.get("control"),
        "created_utc": datetime.fromtimestamp(now, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "created_unix": now,
        "engine_monotonic": engine.get("monotonic"),
        "engine_uptime_s": engine.get("uptime_s"),
        "window": dict(state["window"]),
        "config": status.get("config", {}),
        "privacy": PRIVACY,
    }
    return Snapshot(manifest, state, pages, telemetry, crossing)
