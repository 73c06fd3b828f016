"""EngineClient's named methods build their op's struct (engine/wire/messages/control.py) and
put on the wire the maps they wrote as dicts before."""

from __future__ import annotations

import threading

import pytest
import zmq

from engine.client.engine_client import EngineClient
from engine.wire.protocol import VERSION, reply, unpack


@pytest.fixture
def engine_and_client():
    """A ROUTER that answers every call with an empty reply and keeps each header it got."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind("inproc://engine")
    seen: list[dict] = []
    stop = threading.Event()

    def answer():
        while not stop.is_set():
            if router.poll(20):
                identity, *frames = router.recv_multipart()
                msg = unpack(frames)
                seen.append(msg.header)
                router.send_multipart([identity, *reply(msg.get("id"), {})])

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    client = EngineClient("inproc://engine", context=ctx, timeout_s=10)
    yield client, seen
    stop.set()
    thread.join()
    client.close()
    router.close(0)
    ctx.term()


def test_the_named_methods_write_the_maps_they_always_wrote(engine_and_client):
    client, seen = engine_and_client
    calls = [
        (client.status, (), {"op": "status"}),
        (client.ping, (), {"op": "ping"}),
        (client.start, ("decode-0",), {"op": "start", "worker": "decode-0"}),
        (client.stop, ("decode-0",), {"op": "stop", "worker": "decode-0"}),
        (client.restart, ("decode-0",), {"op": "restart", "worker": "decode-0"}),
        (client.reconfigure, ({"engine": {"max_batch": 2}},), {"op": "reconfigure", "changes": {"engine": {"max_batch": 2}},
                                                              "apply": False}),
        (client.keyframe, (), {"op": "keyframe"}),
        (client.page_metadata, ("decode-0",), {"op": "page_metadata", "pool": "decode-0"}),
        (client.audit, ("r1",), {"op": "audit", "request_id": "r1"}),
        (client.ack_alert, (("a:b",),), {"op": "ack_alert", "ids": ["a:b"]}),
        (client.cancel, ("r1",), {"op": "cancel", "request_id": "r1"}),
    ]
    for method, args, expected in calls:
        method(*args)
        header = seen[-1]
        assert header == {"v": VERSION, "id": header["id"], **expected}
        assert isinstance(header["id"], int)


def test_a_submit_writes_what_its_caller_gave(engine_and_client):
    client, seen = engine_and_client
    stream = client.submit([256, 33], max_new_tokens=5, ignore_eos=True, stream=False, tenant="acme", seed=None)
    client.ping()  # answered after the submit: the submit has arrived by then
    assert seen[0] == {"v": VERSION, "op": "submit", "id": stream, "prompt_ids": [256, 33], "max_new_tokens": 5,
                       "ignore_eos": True, "stream": False, "tenant": "acme"}
    with pytest.raises(TypeError, match="max_tokens"):
        client.submit([1], max_tokens=5)  # not a submit field: refused here, not ignored there
