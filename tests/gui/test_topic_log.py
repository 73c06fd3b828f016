"""Every telemetry topic reaches the model, known or not: its latest payload is kept and its
own event marked, so a topic added on the engine side needs no edit to EngineState (Qt-free)."""

from __future__ import annotations

from engine.wire.protocol import Message, pack, unpack
from gui.model import topic_log
from gui.model.engine_state import EngineState
from gui.model.topic_log import TopicLog, topic_event


def test_an_unknown_topic_is_kept_and_marks_its_event():
    state, heard = EngineState(), []
    state.events[topic_event("kv_hits")].connect(lambda: heard.append(state.topics.payload("kv_hits")))
    changed = state.apply(unpack(pack({"topic": "kv_hits", "seq": 3, "hits": 5, "by_tenant": {"acme": 4}})), now=2.0)
    assert changed == {"topic:kv_hits", "topics"}
    assert set(state.events.pending) == {"topic:kv_hits", "topics"}
    entry = state.topics.latest["kv_hits"]
    assert (entry.header["hits"], entry.header["by_tenant"], entry.at, entry.count) == (5, {"acme": 4}, 2.0, 1)
    state.events.flush()
    assert heard == [entry.header]
    state.apply(Message({"topic": "kv_hits", "seq": 4, "hits": 6}), now=3.0)
    assert state.topics.payload("kv_hits")["hits"] == 6 and state.topics.latest["kv_hits"].count == 2


def test_a_known_topic_keeps_its_typed_handling_and_is_kept_too():
    state = EngineState()
    changed = state.apply(Message({"topic": "metrics", "seq": 1, "tokens_per_s": 9.0}), now=1.0)
    assert changed == {"metrics", "topic:metrics", "topics"}
    assert list(state.metrics["tokens_per_s"]) == [(1.0, 9.0)]
    assert state.topics.payload("metrics")["tokens_per_s"] == 9.0


def test_a_view_can_follow_a_topic_before_its_first_message():
    state, heard = EngineState(), []
    state.events[topic_event("later")].connect(lambda: heard.append(1))
    assert "topic:later" in state.events.names
    state.events.mark_all()  # a fresh window's state: every declared event, this one too
    state.events.flush()
    assert heard == [1]


def test_topic_names_are_bounded(monkeypatch):
    monkeypatch.setattr(topic_log, "MAX_TOPICS", 2)
    log = TopicLog()
    assert log.store("a", {}, 1.0, 1.0) and log.store("b", {}, 1.0, 1.0)
    assert not log.store("c", {}, 1.0, 1.0) and log.refused == 1
    assert log.store("a", {"x": 1}, 2.0, 2.0)  # a topic already kept is always updated
    assert set(log.latest) == {"a", "b"} and log.payload("c") is None
    state = EngineState()
    state.topics = log
    assert state.apply(Message({"topic": "d"})) == set()  # refused: no event for it either
