"""Where the supervisor's memory goes, for a soak (bench/memory_soak.py).

PAGEWARDEN_TRACEMALLOC=FILE in the environment of `serve`: tracemalloc starts with the process
and every SIGUSR2 appends one JSON line to FILE: the traced total and the 30 largest allocation
sites (file:line, size, count). Off unless asked: tracing costs the supervisor time.
"""

from __future__ import annotations

import json
import os
import signal
import time
import tracemalloc

ENV = "PAGEWARDEN_TRACEMALLOC"
TOP = 30


def install_from_env() -> bool:
    path = os.environ.get(ENV)
    if not path:
        return False
    tracemalloc.start(1)

    def dump(*_: object) -> None:
        snapshot = tracemalloc.take_snapshot()
        stats = snapshot.statistics("lineno")
        line = {"time": time.time(), "traced": sum(s.size for s in stats),
                "top": [{"where": str(s.traceback[0]), "size": s.size, "count": s.count} for s in stats[:TOP]]}
        with open(path, "a") as f:
            f.write(json.dumps(line) + "\n")

    signal.signal(signal.SIGUSR2, dump)
    return True
