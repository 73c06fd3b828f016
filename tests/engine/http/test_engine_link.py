"""EngineLink's waiting rules against a scripted engine (a real ROUTER on loopback): a
streamed request that hears nothing for the idle timeout ends in TimeoutError; one that does
not stream is silent until `done` by design, so the link pings the engine instead and keeps
waiting while it answers, and gives up when it does not."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import zmq

from engine.http.engine_link import EngineLink
from engine.wire.protocol import pack, reply, unpack


class ScriptedEngine:
    """Answers submit with `accepted`, then `done` after `done_after_s`; answers ping while
    `alive`."""

    def __init__(self, done_after_s: float, alive: bool = True):
        self.done_after_s, self.alive = done_after_s, alive
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.pings = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        pending = []  # (when, identity, id)
        while not self._stop.is_set():
            if self.sock.poll(10):
                identity, *body = self.sock.recv_multipart()
                msg = unpack(body)
                if msg.op == "submit":
                    self.sock.send_multipart([identity, *pack({"op": "accepted", "id": msg.get("id")})])
                    pending.append((time.monotonic() + self.done_after_s, identity, msg.get("id")))
                elif msg.op == "ping" and self.alive:
                    self.pings += 1
                    self.sock.send_multipart([identity, *reply(msg.get("id"), {"pong": 1})])
            for item in [p for p in pending if p[0] <= time.monotonic()]:
                pending.remove(item)
                self.sock.send_multipart([item[1], *pack({"op": "done", "id": item[2], "token_ids": [1],
                                                          "text": "x"})])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close(linger=0)
        self.ctx.term()


async def collect(engine: ScriptedEngine, fields: dict, idle_timeout_s: float) -> list[str]:
    link = EngineLink(f"tcp://127.0.0.1:{engine.port}")
    link.start()
    try:
        return [msg.op async for msg in link.stream(fields, idle_timeout_s)]
    finally:
        await link.close()


@pytest.fixture
def engine_factory():
    made = []

    def make(**kw) -> ScriptedEngine:
        made.append(ScriptedEngine(**kw))
        return made[-1]

    yield make
    for engine in made:
        engine.close()


def test_a_request_that_does_not_stream_waits_past_the_idle_timeout_while_the_engine_answers_pings(engine_factory):
    engine = engine_factory(done_after_s=1.0)
    assert asyncio.run(collect(engine, {"stream": False}, idle_timeout_s=0.2)) == ["accepted", "done"]
    assert engine.pings >= 2


def test_a_silent_streamed_request_times_out(engine_factory):
    engine = engine_factory(done_after_s=5.0)
    with pytest.raises(TimeoutError, match="no answer from the engine"):
        asyncio.run(collect(engine, {"stream": True}, idle_timeout_s=0.2))
    assert engine.pings == 0


def test_a_request_that_does_not_stream_times_out_when_the_engine_stops_answering(engine_factory):
    engine = engine_factory(done_after_s=5.0, alive=False)
    with pytest.raises(TimeoutError, match="no answer from the engine"):
        asyncio.run(collect(engine, {"stream": False}, idle_timeout_s=0.2))
