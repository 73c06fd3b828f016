"""Bad input on every socket the supervisor binds: clear error replies for malformed
requests, and 10,000 random or truncated frames that leave the server serving."""

from __future__ import annotations

import os
import random

import msgpack
import pytest
import zmq

from engine.client import RemoteError
from engine.wire.protocol import pack

pytestmark = pytest.mark.e2e  # real engine processes


FUZZ_FRAMES = 10_000


@pytest.mark.parametrize(
    "fields, code, fragment",
    [
        ({"prompt_ids": []}, "invalid_request", "the prompt is empty"),
        ({"prompt_ids": [1, 2], "max_new_tokens": -3}, "invalid_request", "max_new_tokens = -3 must be at least 1"),
        ({"prompt_ids": [1, 2], "max_new_tokens": "ten"}, "bad_message", "field 'max_new_tokens' = 'ten': Expected `int`"),
        ({"prompt_ids": "1,2"}, "bad_message", "field 'prompt_ids' = '1,2': Expected `array | null`"),
        ({"prompt_ids": [1, 99999]}, "invalid_request", "prompt token 1 = 99999 is outside the vocabulary"),
        ({"prompt_ids": [1], "prompt": "x"}, "invalid_request", "give exactly one of 'prompt_ids' and 'prompt'"),
        ({"prompt_ids": [1], "temperature": -1.0}, "invalid_request", "temperature = -1.0 must be a finite number"),
    ],
)
def test_bad_submits_get_clear_errors(shared_server, fields, code, fragment):
    client = shared_server.client()
    with pytest.raises(RemoteError) as err:
        client.call("submit", **fields)
    assert err.value.code == code and fragment in str(err.value)


@pytest.mark.parametrize("temperature", [1e-40, 5e-324])
def test_a_tiny_temperature_does_not_take_a_worker_down(shared_server, temperature):
    """Issue 14: one such request killed the prefill worker and every later request queued
    forever. It is greedy now: the same tokens as temperature 0, and the workers serve on."""
    client = shared_server.client()
    greedy = client.generate([256, 33, 44], max_new_tokens=5, ignore_eos=True)["token_ids"]
    tiny = client.generate([256, 33, 44], max_new_tokens=5, ignore_eos=True, temperature=temperature, timeout_s=120)
    assert tiny["token_ids"] == greedy and tiny["finish_reason"] == "length"
    assert {w["name"]: w["state"] for w in client.status()["workers"]} == {"prefill-0": "ready", "decode-0": "ready"}
    after = client.generate([256, 33, 44], max_new_tokens=5, ignore_eos=True, timeout_s=120)
    assert after["token_ids"] == greedy


def test_unknown_op_and_wrong_version(shared_server):
    client = shared_server.client()
    with pytest.raises(RemoteError, match="unknown op 'explode'") as err:
        client.call("explode")
    assert err.value.code == "bad_message"
    client.sock.send_multipart([msgpack.packb({"v": 99, "op": "status", "id": 7})])
    reply = client.recv_for(7, timeout_s=10)  # refused, but answered with its id
    assert reply.op == "error" and "schema version 99 is not supported" in reply.get("error")["message"]


def _garbage(rng: random.Random, valid: list) -> list:
    kind = rng.randrange(6)
    if kind == 0:
        return [rng.randbytes(rng.randrange(0, 200))]
    if kind == 1:  # a real message cut short
        frame = bytes(valid[0])
        return [frame[: rng.randrange(len(frame))]]
    if kind == 2:
        return [msgpack.packb(rng.choice([1, "x", [1, 2], None, {"v": 1}, {"v": 1, "op": 5}]))]
    if kind == 3:  # arrays announced, frames missing or short
        return [msgpack.packb({"v": 1, "op": "submit", "arrays": [["a", "i8", [4]]]}), rng.randbytes(rng.randrange(31))]
    if kind == 4:
        return [rng.randbytes(8) for _ in range(rng.randrange(1, 6))]
    return [msgpack.packb({"v": 1, "op": rng.choice(["submit", "stop", "reserve", "tokens", "hello"]),
                           "id": rng.randrange(100), rng.choice(["worker", "prompt_ids", "items"]): rng.randbytes(4)})]


def test_fuzz_every_bound_socket_then_serve_correctly(shared_server):
    client = shared_server.client()
    status = client.status()
    expected = client.generate([256, 33, 44], max_new_tokens=5, ignore_eos=True)["token_ids"]
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    valid = pack({"op": "status", "id": 1})
    ctx = zmq.Context()
    try:
        targets = [  # (socket type, endpoint, identity)
            (zmq.DEALER, shared_server.control, None),  # the control ROUTER
            (zmq.DEALER, status["engine"]["bus"], b"intruder"),  # the worker bus ROUTER
            (zmq.XSUB, shared_server.telemetry, None),  # the telemetry XPUB
        ]
        for kind, endpoint, identity in targets:
            sock = ctx.socket(kind)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDTIMEO, 30_000)  # a refused peer must fail the test, not hang it
            if identity:
                sock.setsockopt(zmq.IDENTITY, identity)
            sock.connect(endpoint)
            for _ in range(FUZZ_FRAMES):
                sock.send_multipart(_garbage(rng, valid))
            sock.close()
        # A peer claiming a live worker's name is not handed its identity: nothing it sends
        # arrives, so its queue fills and it is refused, while the real worker keeps its link.
        impostor = ctx.socket(zmq.DEALER)
        impostor.setsockopt(zmq.LINGER, 0)
        impostor.setsockopt(zmq.SNDTIMEO, 2000)
        impostor.setsockopt(zmq.SNDHWM, 10)
        impostor.setsockopt(zmq.IDENTITY, b"decode-0")
        impostor.connect(status["engine"]["bus"])
        with pytest.raises(zmq.Again):
            for _ in range(FUZZ_FRAMES):
                impostor.send_multipart(pack({"op": "tokens", "items": [], "finished": [], "free_pages": 0}))
        impostor.close()
    finally:
        ctx.term()
    # the server answers correctly afterwards, and its workers survived
    again = client.generate([256, 33, 44], max_new_tokens=5, ignore_eos=True, timeout_s=120)
    assert again["token_ids"] == expected, f"fuzz seed {seed}"
    after = client.status()
    assert all(w["state"] == "ready" for w in after["workers"]), after["workers"]
    assert after["counters"].get("bad_messages", 0) > 0


@pytest.mark.parametrize("case", ["mismatched array frames", "oversized header", "id after a bad field"])
def test_an_error_reply_carries_the_id_of_a_message_that_does_not_unpack(shared_server, case):
    """Issue 14, item 4: these got replies with id=None, so the caller waited out its timeout
    (EngineClient 20-30 s, the HTTP front 300 s). Now the reply names the caller's id."""
    client = shared_server.client()
    if case == "mismatched array frames":
        frames = [msgpack.packb({"v": 1, "op": "submit", "id": 4242, "arrays": [["a", "i8", [4]]]}), b"short"]
    elif case == "oversized header":
        frames = [msgpack.packb({"v": 1, "op": "submit", "pad": "x" * (9 << 20), "id": 4242})]
    else:
        frames = [msgpack.packb({"v": 1, "op": "status", "pad": {"deep": [1, 2, {"x": b"y"}]}, "id": 4242,
                                 "arrays": "not a list"})]
    client.sock.send_multipart(frames)
    reply = client.recv_for(4242, timeout_s=20)  # a reply with id None would time out here
    assert reply.op == "error" and reply.get("error")["code"] == "bad_message"


def test_one_client_cannot_take_more_than_its_budget(start_server):
    """Issue 14, per-client budgets: one client filling the queue starved the others."""
    server = start_server(engine={"max_requests_per_client": 2})
    greedy, other = server.client(), server.client()
    held = []
    for _ in range(2):
        accepted = next(greedy.events(greedy.submit([256, 3, 4], max_new_tokens=1500, ignore_eos=True)))
        assert accepted.op == "accepted"
        held.append(accepted.get("request_id"))
    with pytest.raises(RemoteError) as err:
        greedy.generate([256, 5], max_new_tokens=2, timeout_s=60)
    assert err.value.code == "budget_exceeded"
    assert "this client has 2 requests queued or running" in str(err.value)
    assert "engine.max_requests_per_client = 2" in str(err.value)
    assert len(other.generate([256, 5], max_new_tokens=2, ignore_eos=True, timeout_s=120)["token_ids"]) == 2
    for rid in held:  # once its requests end, the client may submit again
        greedy.cancel(rid)
    assert len(greedy.generate([256, 5], max_new_tokens=2, ignore_eos=True, timeout_s=120)["token_ids"]) == 2
