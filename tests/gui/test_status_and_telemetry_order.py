"""The window's model hears of workers twice: from status replies and from the `workers` topic.
A topic message published before a status reply but delivered after it (late under load) is
older than the reply and must not turn a restarted worker back into a crashed one."""

from __future__ import annotations

from engine.wire.protocol import Message
from gui.model.engine_state import EngineState


def _worker(state: str) -> dict:
    return {"name": "decode-0", "role": "decode", "state": state, "pid": 7, "pool": {"name": "decode-0"}}


def test_a_workers_message_older_than_the_status_reply_is_not_applied():
    model = EngineState()
    model.apply_status({"engine": {"started": 1.0}, "workers": [_worker("ready")],
                        "telemetry_seq": {"workers": 10, "capacity": 4}})
    model.apply(Message({"topic": "workers", "seq": 9, "workers": [_worker("crashed")]}))
    assert [w.state for w in model.workers] == ["ready"]  # published before the reply: stale
    model.apply(Message({"topic": "workers", "seq": 11, "workers": [_worker("crashed")]}))
    assert [w.state for w in model.workers] == ["crashed"]  # published after it: news
    model.apply(Message({"topic": "capacity", "seq": 3, "findings": [{"limit": "x", "exceeds": True}]}))
    assert model.capacity == []
