"""Worker failures: a killed worker is noticed, its requests fail with a clear error, the
supervisor keeps serving, and `start` brings the worker back. Stopping is orderly."""

from __future__ import annotations

import os
import signal

import pytest

from engine.config import EngineConfig
from engine.core import Engine
from engine.request import SamplingParams

pytestmark = pytest.mark.e2e  # real engine processes

LONG = dict(max_new_tokens=1500, ignore_eos=True)


def _first_token(client, stream) -> None:
    for msg in client.events(stream):
        if msg.op == "token":
            return
        assert msg.op == "accepted", msg.header


def _end(client, stream) -> dict:
    for msg in client.events(stream):
        if msg.op in ("done", "error"):
            return msg.header
    raise AssertionError("stream ended without done")


def test_killed_decode_worker_fails_its_requests_and_comes_back(start_server, tiny_model):
    server = start_server(engine={"context_window": 2048})
    client = server.client()
    pid = next(w["pid"] for w in client.status()["workers"] if w["name"] == "decode-0")
    streams = [client.submit([256, 10 + i], **LONG) for i in range(3)]
    for stream in streams:
        _first_token(client, stream)
    os.kill(pid, signal.SIGKILL)
    for stream in streams:
        done = _end(client, stream)
        assert done["error"]["code"] == "worker_crashed"
        assert f"worker decode-0 (pid {pid})" in done["error"]["message"]
        assert "killed by signal 9" in done["error"]["message"]
    status = client.status()
    decode = next(w for w in status["workers"] if w["name"] == "decode-0")
    assert decode["state"] == "crashed" and decode["exit_code"] == -9
    assert next(w for w in status["workers"] if w["name"] == "prefill-0")["state"] == "ready"

    client.start("decode-0")
    server.wait_workers(client, names=["decode-0"])
    new_pid = next(w["pid"] for w in client.status()["workers"] if w["name"] == "decode-0")
    assert new_pid != pid
    done = client.generate([256, 1, 2, 3], max_new_tokens=6, ignore_eos=True)
    local = Engine(EngineConfig().replace(model={"device": "cpu"}, engine={"kernels": "torch"}), tiny_model)
    (want,) = local.generate([[256, 1, 2, 3]], SamplingParams(max_new_tokens=6, ignore_eos=True))
    assert done["token_ids"] == want.output_ids


def test_stopping_a_worker_fails_inflight_and_queued_requests_wait(start_server):
    server = start_server()
    client = server.client()
    running = client.submit([256, 5], **LONG)
    _first_token(client, running)
    client.stop("decode-0")
    done = _end(client, running)
    assert done["error"]["code"] == "worker_stopped"
    server.wait_workers(client, "stopped", names=["decode-0"])
    waiting = client.submit([256, 6, 7], max_new_tokens=4, ignore_eos=True)
    accepted = next(client.events(waiting))
    assert accepted.op == "accepted"
    rid = accepted.get("request_id")
    assert client.audit(rid)["request"]["phase"] == "queued"  # waits, is not failed
    client.start("decode-0")
    done = _end(client, waiting)
    assert done.get("error") is None and len(done["token_ids"]) == 4


def test_killed_prefill_worker_is_noticed_too(start_server):
    server = start_server()
    client = server.client()
    pid = next(w["pid"] for w in client.status()["workers"] if w["name"] == "prefill-0")
    os.kill(pid, signal.SIGKILL)
    status = server.wait_workers(client, "crashed", names=["prefill-0"], timeout_s=30)
    prefill = next(w for w in status["workers"] if w["name"] == "prefill-0")
    assert "killed by signal 9" in prefill["reason"]
    stream = client.submit([256, 9], max_new_tokens=3, ignore_eos=True)
    assert next(client.events(stream)).op == "accepted"  # queued until a prefill worker returns
    client.start("prefill-0")
    assert len(_end(client, stream)["token_ids"]) == 3
