"""The telemetry topics the supervisor publishes on a period, each with its period and what
it publishes: adding one is its Topic member (engine/wire/states.py) and a line here.

A topic that also goes out on change (workers, capacity) publishes through its Supervisor
method, which resets its period; requests and alerts go out on each change only, and pages
are relayed from the workers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.wire.states import Topic

if TYPE_CHECKING:
    from engine.server.supervisor import Supervisor


@dataclass(frozen=True)
class PeriodicTopic:
    topic: Topic
    period_s: float
    publish: Callable[[Supervisor, float], None]  # (supervisor, monotonic now)


def _metrics(sup: Supervisor, now: float) -> None:
    sup.telemetry.publish(Topic.METRICS, {**sup.metrics.snapshot(now), **sup.load()})


PERIODIC_TOPICS = (
    PeriodicTopic(Topic.METRICS, 1.0, _metrics),
    PeriodicTopic(Topic.WORKERS, 2.0, lambda sup, now: sup.publish_workers()),
    PeriodicTopic(Topic.CAPACITY, 10.0, lambda sup, now: sup.publish_capacity()),
)
