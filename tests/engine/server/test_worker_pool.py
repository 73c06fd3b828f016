"""WorkerPool: the one owner of worker states. Real child processes (a sleeping Python stands
in for a worker), real exits; the supervisor's side is the callbacks."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from engine.server.worker_handle import WorkerHandle, WorkerState
from engine.server.worker_pool import WorkerPool


def _fake_spawn(self, config_dict, bus_endpoint):
    if self.proc is not None:
        self.restarts += 1
    self.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    self.state, self.info, self.stats = WorkerState.STARTING, {}, {}
    self.started_at = self.last_seen = time.monotonic()
    self.exit_code, self.reason = None, ""


@pytest.fixture
def pool(monkeypatch, tmp_path):
    monkeypatch.setattr(WorkerHandle, "spawn", _fake_spawn)
    seen = {"sent": [], "spawned": [], "exits": [], "silent": [], "stopping": []}
    pool = WorkerPool({"prefill": 1, "decode": 1}, tmp_path, "ipc://unused", config=lambda: {},
                      send=lambda w, h: seen["sent"].append((w.name, h["op"])),
                      on_spawn=lambda w: seen["spawned"].append(w.name),
                      on_silent=lambda w, s: seen["silent"].append(w.name),
                      on_stop=lambda w: seen["stopping"].append((w.name, list(seen["sent"]))),
                      on_exit=lambda w, crashed: seen["exits"].append((w.name, w.state, crashed)))
    pool.seen = seen
    yield pool
    for worker in pool.values():
        worker.kill()


def _wait_exit(worker: WorkerHandle) -> None:
    worker.proc.wait(timeout=10)


def test_start_hello_drain_restart(pool):
    pool.start_all()
    assert list(pool) == ["prefill-0", "decode-0"] and pool.seen["spawned"] == ["prefill-0", "decode-0"]
    decode = pool["decode-0"]
    assert decode.state == WorkerState.STARTING and pool.role("decode") == [decode]
    pool.hello(decode, {"pool": {"pages": 8}})
    assert decode.state == WorkerState.READY and decode.accepting and decode.free_pages == 8
    with pytest.raises(ValueError, match="said hello while ready"):
        pool.hello(decode, {"pool": {"pages": 8}})
    decode.inflight.add("r1")
    pool.drain(decode)
    pool.watch()
    assert decode.state == WorkerState.DRAINING  # still has a request
    decode.inflight.clear()
    pool.watch()
    assert decode.state == WorkerState.STOPPING and ("decode-0", "stop") in pool.seen["sent"]
    assert pool.seen["stopping"] == [("decode-0", [])]  # told the supervisor before the worker
    decode.proc.terminate()  # it obeys the shutdown
    _wait_exit(decode)
    pool.watch()
    assert ("decode-0", WorkerState.STOPPED, False) in pool.seen["exits"]
    assert decode.state == WorkerState.STARTING and decode.restarts == 1  # restarted after the stop


def test_an_unasked_exit_is_a_crash_with_the_reason(pool):
    pool.start_all()
    prefill = pool["prefill-0"]
    pool.hello(prefill, {"pool": {"pages": 4}})
    prefill.proc.kill()
    _wait_exit(prefill)
    pool.watch()
    assert prefill.state == WorkerState.CRASHED and prefill.reason == "was killed by signal 9"
    assert pool.seen["exits"] == [("prefill-0", WorkerState.CRASHED, True)]
    pool.watch()
    assert len(pool.seen["exits"]) == 1  # reported once
    assert not pool.stop(prefill)  # nothing to stop: STOPPED at once
    assert prefill.state == WorkerState.STOPPED


def test_silence_is_reported_and_shutdown_ends_everything(pool):
    pool.start_all()
    decode = pool["decode-0"]
    pool.hello(decode, {"pool": {"pages": 4}})
    decode.last_seen -= 15  # past UNRESPONSIVE_S, before the heartbeat timeout
    pool.watch()
    assert pool.seen["silent"] == ["decode-0"] and decode.state == WorkerState.READY
    pool.shutdown(timeout_s=0.2)
    assert all(not pool.alive(w) for w in pool.values())
    assert {("prefill-0", "stop"), ("decode-0", "stop")} <= set(pool.seen["sent"])
