"""TopicLog: the latest payload of every telemetry topic the window received, known or not (Qt-free).

EngineState folds the topics it understands into typed parts (pages, requests, alerts, …);
this log keeps every topic's last header besides, so that a topic added on the engine side
is seen at once — by a view that follows its event (`topic_event(name)`), or by nobody but
the Telemetry inspector — with no edit to the model.
"""

from __future__ import annotations

from dataclasses import dataclass

TOPIC_EVENT_PREFIX = "topic:"
MAX_TOPICS = 256  # distinct topic names kept: an engine that invents names cannot grow the window without bound


def topic_event(topic: str) -> str:
    """The event a view follows to hear about `topic` ("topic:" + the topic)."""
    return TOPIC_EVENT_PREFIX + topic


@dataclass(frozen=True)
class TopicPayload:
    """One topic's latest message, as it arrived."""

    topic: str
    header: dict  # the decoded header; array frames appear only as its `arrays` specs [name, dtype, shape]
    at: float  # monotonic time it arrived
    wall: float  # wall-clock time it arrived (what the inspector shows)
    count: int  # messages of this topic so far


class TopicLog:
    def __init__(self):
        self.latest: dict[str, TopicPayload] = {}
        self.refused = 0  # messages of topics over MAX_TOPICS, not kept

    def store(self, topic: str, header: dict, at: float, wall: float) -> bool:
        """Keep `header` as `topic`'s latest payload; False (not kept) for a new topic over MAX_TOPICS."""
        before = self.latest.get(topic)
        if before is None and len(self.latest) >= MAX_TOPICS:
            self.refused += 1
            return False
        self.latest[topic] = TopicPayload(topic, header, at, wall, (before.count if before else 0) + 1)
        return True

    def payload(self, topic: str) -> dict | None:
        """The latest header of `topic`, or None before its first message."""
        entry = self.latest.get(topic)
        return entry.header if entry is not None else None
