"""The `status` answer: the whole engine as one map (a window polls it with brief=True)."""

from __future__ import annotations

import socket
import time
from typing import TYPE_CHECKING, Any

from engine import __version__
from engine.server.alert_forward import shown_config

if TYPE_CHECKING:
    from engine.server.supervisor import Supervisor


def status_report(sup: Supervisor, crossings: dict[str, Any], *, brief: bool) -> dict[str, Any]:
    """brief: leave out config and alerts."""
    result: dict[str, Any] = {
        "engine": {
            "version": __version__, "role": "pagewarden", "control": sup.control_endpoint, "telemetry": sup.telemetry_endpoint,
            "bus": sup.bus_endpoint,
            "curve": sup.curve is not None, "allow_faults": sup.allow_faults,
            "uptime_s": time.time() - sup.started_at, "started": sup.started_at,
            "hostname": socket.gethostname(),
            "time": time.time(), "monotonic": time.monotonic(),
            "model": str(sup.config.model.resolved_path()), "architecture": sup.model_config.architecture,
            "vocab_size": sup.model_config.vocab_size,
            "run": sup.evidence.journal.run if sup.evidence.journal is not None else None,
        },
        "config": shown_config(sup.config),
        "workers": [w.describe() for w in sup.workers.values()],
        "capacity": [f.to_dict() for f in sup.findings],
        "counters": dict(sup.counters),
        "alert_episodes": dict(sup.alerts.fired),  # kind -> episodes that fired (counters hold the events)
        "load": sup.load(),
        "metrics": {**sup.metrics.snapshot(), **sup.metrics.totals()},
        "cross_reads": {"total": sup.reads.total, "dropped": sup.reads.dropped_reads},
        "crossings": crossings,
        "telemetry_seq": dict(sup.telemetry.seq),
        "telemetry": sup.telemetry.describe(),
        "canaries": sup.canaries.describe(),
        "alert_forwarding": sup.forwarder.describe(),
        "evidence": sup.evidence.describe(),
    }
    if not brief:
        result["alerts"] = sup.alerts.records()
    else:
        del result["config"]
    return result
