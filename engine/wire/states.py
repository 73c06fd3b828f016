"""The states the engine reports on the wire, declared once: a request's phase, a worker's
state, an alert's state, and the telemetry topics. The supervisor writes them, and the client,
the GUI, the snapshot code and the vLLM agent read them from here, so that a new phase or state
is added in one place (each a StrEnum: its members are the strings the wire carries, equal to
them, formatted as them, and msgpack sends them as them).
"""

from __future__ import annotations

import enum


class Phase(enum.StrEnum):
    """Where a request is, from admission to its end."""

    QUEUED = "queued"  # admitted, waiting for a decode worker with room
    RESERVING = "reserving"  # the decode worker is reserving its pages
    AWAITING_PREFILL = "awaiting_prefill"  # reserved, waiting for a prefill worker
    PREFILLING = "prefilling"  # prefill job sent; the transfer goes straight to decode
    DECODING = "decoding"  # transfer verified; tokens flow
    FINISHED = "finished"
    FAILED = "failed"
    REJECTED = "rejected"
    CANCELLED = "cancelled"


END_PHASES = (Phase.FINISHED, Phase.FAILED, Phase.REJECTED, Phase.CANCELLED)  # a request ends in one of these
STOPPED_PHASES = (Phase.FAILED, Phase.CANCELLED, Phase.REJECTED)  # ... without an answer
FAILED_PHASES = (Phase.FAILED, Phase.REJECTED)  # ... because the engine could not or would not serve it
RUNNING_PHASES = tuple(p for p in Phase if p not in END_PHASES)


class WorkerState(enum.StrEnum):
    """A worker process as the supervisor manages it."""

    STARTING = "starting"  # process spawned, no hello yet
    READY = "ready"
    DRAINING = "draining"  # takes no new requests; restarts when its last one is done
    STOPPING = "stopping"
    STOPPED = "stopped"
    CRASHED = "crashed"


WORKER_UP = (WorkerState.READY, WorkerState.STARTING, WorkerState.DRAINING)  # its process is running
WORKER_STARTABLE = (WorkerState.STOPPED, WorkerState.CRASHED)  # an operator may start it


class AlertState(enum.StrEnum):
    PENDING = "pending"  # a condition seen but not yet confirmed (a worker silent past its first bound)
    FIRING = "firing"
    RESOLVED = "resolved"


class Topic(enum.StrEnum):
    """Telemetry topics the supervisor (and the vLLM agent) publish. Pages go per pool:
    `pages_topic(pool)`; a subscriber to PAGES_PREFIX gets every pool's."""

    REQUESTS = "requests"
    METRICS = "metrics"
    ALERTS = "alerts"
    WORKERS = "workers"
    CAPACITY = "capacity"


PAGES_PREFIX = "pages/"


def pages_topic(pool: str) -> str:
    return PAGES_PREFIX + pool
