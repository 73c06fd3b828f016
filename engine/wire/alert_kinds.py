"""Every alert kind the engine (or the app, for its own probe) can raise: declared once.

The supervisor's AlertBook refuses a kind not declared here, reproduction counts the
detectors from it, and the GUI and snapshot schema read the severities. Adding an alert
kind is one entry here plus the code that fires it (and its test).
"""

from __future__ import annotations

from typing import NamedTuple

SEVERITIES = ("info", "warning", "error", "critical")  # lowest first


class AlertKind(NamedTuple):
    name: str
    severity: str  # the usual severity (a caller may raise or lower it for one alert)
    detects_cross_reads: bool  # a detector of cross-request reads: reproduction scores it
    isolation: bool  # an isolation failure (not an admission decision or a worker condition)
    help: str


ALERT_KINDS = (
    AlertKind("ownership_violation", "critical", True, True,
              "a request read or wrote a token slot another request (or nobody) wrote (I1)"),
    AlertKind("transfer_mismatch", "critical", True, True, "a KV transfer did not match its manifest (I3)"),
    AlertKind("transfer_timeout", "critical", True, True, "a KV transfer did not complete in time"),
    AlertKind("late_write_landed", "critical", True, True,
              "a transfer wrote pages after their reservation ended (I4 off: written anyway)"),
    AlertKind("late_write_dropped", "warning", True, True, "a late transfer write was dropped (I4)"),
    AlertKind("canary_leak", "critical", True, True, "a request touched pages a canary wrote"),
    AlertKind("canary_marker_in_output", "critical", True, True, "a canary's marker text came out in a reply"),
    AlertKind("admission_rejected", "info", True, False, "a request was refused before any allocation (I2)"),
    AlertKind("capacity_exceeds_window", "critical", False, False,
              "the advertised context window exceeds what the pools can hold"),
    AlertKind("worker_crashed", "critical", False, False, "a worker process exited"),
    AlertKind("worker_restarted", "warning", False, False, "a crashed worker was started again by the restart policy"),
    AlertKind("worker_unresponsive", "warning", False, False, "a worker stopped answering heartbeats"),
    AlertKind("reconfigure_rolled_back", "error", False, False,
              "a worker restarted for a reconfigure crashed before it was ready: the old config is back"),
    AlertKind("internal_error", "error", False, False, "the server failed to handle a message"),
    AlertKind("telemetry_subscriptions_capped", "warning", False, False,
              "more distinct telemetry subscriptions than the limit: the publisher was reset"),
    AlertKind("probe_error", "warning", False, False, "the app's black-box probe could not run a round"),
)

BY_NAME = {kind.name: kind for kind in ALERT_KINDS}
DETECTORS = tuple(kind.name for kind in ALERT_KINDS if kind.detects_cross_reads)
ISOLATION_KINDS = tuple(kind.name for kind in ALERT_KINDS if kind.isolation)


def alert_kind(name: str) -> AlertKind:
    """The declaration of `name`; raises ValueError naming the unknown kind."""
    try:
        return BY_NAME[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown alert kind {name!r}; declared: {', '.join(BY_NAME)}") from None


def check_severity(severity: str) -> str:
    if severity not in SEVERITIES:
        raise ValueError(f"unknown alert severity {severity!r}; one of {', '.join(SEVERITIES)}")
    return severity
