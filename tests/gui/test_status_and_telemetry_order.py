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


def test_a_status_reply_older_than_a_workers_message_already_applied_does_not_put_it_back():
    """The reply and the topic come on two sockets: a reply made while a worker was crashed can
    arrive after the `workers` message that said it restarted (seen as a flaky GUI test)."""
    model = EngineState()
    model.apply_status({"engine": {"started": 1.0}, "workers": [_worker("crashed")],
                        "telemetry_seq": {"workers": 5, "capacity": 1}})
    model.apply(Message({"topic": "workers", "seq": 6, "workers": [_worker("ready")]}))
    # made when the last workers message sent was seq 5: older than what was applied
    model.apply_status({"engine": {"started": 1.0}, "workers": [_worker("crashed")],
                        "telemetry_seq": {"workers": 5, "capacity": 1}})
    assert [w.state for w in model.workers] == ["ready"]
    # a reply made after it says what is now
    model.apply_status({"engine": {"started": 1.0}, "workers": [_worker("stopped")],
                        "telemetry_seq": {"workers": 6, "capacity": 1}})
    assert [w.state for w in model.workers] == ["stopped"]
    # another engine run counts from 1 again: its reply is not held against the old numbers
    model.apply_status({"engine": {"started": 2.0, "uptime_s": 1.0}, "workers": [_worker("ready")],
                        "telemetry_seq": {"workers": 1, "capacity": 1}})
    assert [w.state for w in model.workers] == ["ready"]
