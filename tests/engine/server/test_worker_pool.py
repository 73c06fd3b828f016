"""WorkerPool: the one owner of worker states. Real child processes (a sleeping Python stands
in for a worker), real exits; the supervisor's side is the callbacks."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from engine.server.worker_handle import WorkerHandle, WorkerState
from engine.server.worker_pool import WorkerPool
from engine.wire.messages.base import op_of


def _fake_spawn(self, config_dict, bus_endpoint):
    if self.proc is not None:
        self.restarts += 1
    self.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    self.state, self.info, self.stats = WorkerState.STARTING, {}, {}
    self.started_at = self.last_seen = time.monotonic()
    self.exit_code, self.reason, self.ready_at, self.restart_at = None, "", 0.0, None


@pytest.fixture
def policy():
    return {}  # the [workers] table the pool reads its restart policy from (defaults when empty)


@pytest.fixture
def pool(monkeypatch, tmp_path, policy):
    monkeypatch.setattr(WorkerHandle, "spawn", _fake_spawn)
    seen = {"sent": [], "spawned": [], "exits": [], "silent": [], "stopping": []}
    pool = WorkerPool({"prefill": 1, "decode": 1}, tmp_path, "ipc://unused", config=lambda: {"workers": policy},
                      send=lambda w, command: seen["sent"].append((w.name, op_of(command))),
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
    assert prefill.state == WorkerState.CRASHED and prefill.reason.startswith("was killed by signal 9; ")
    assert pool.seen["exits"] == [("prefill-0", WorkerState.CRASHED, True)]
    pool.watch()
    assert len(pool.seen["exits"]) == 1  # reported once
    assert not pool.stop(prefill)  # nothing to stop: STOPPED at once, and no restart is due any more
    assert prefill.state == WorkerState.STOPPED and prefill.restart_at is None
    pool.watch(time.monotonic() + 3600)
    assert prefill.state == WorkerState.STOPPED


def _crash(pool, worker, *, ready_for: float = 0.0) -> float:
    """The worker says hello, is ready for `ready_for` seconds, then dies unasked."""
    pool.hello(worker, {"pool": {"pages": 4}})
    worker.ready_at -= ready_for
    worker.proc.kill()
    _wait_exit(worker)
    now = time.monotonic()
    pool.watch(now)
    assert worker.state == WorkerState.CRASHED
    return now


@pytest.mark.parametrize("policy", [{"restart_backoff_ms": 500, "restart_limit": 3}])
def test_a_crashed_worker_restarts_after_a_doubling_backoff_up_to_the_limit(pool):
    pool.start_all()
    decode = pool["decode-0"]
    for n, backoff in enumerate((0.5, 1.0, 2.0), start=1):
        crashed_at = _crash(pool, decode)
        assert decode.crashes_in_a_row == n
        assert f"restarting in {backoff:.1f} s (crash {n} in a row of at most 3)" in decode.reason
        assert decode.restart_at == pytest.approx(crashed_at + backoff, abs=0.05)
        pool.watch(decode.restart_at - 0.01)
        assert decode.state == WorkerState.CRASHED  # not before its time
        pool.watch(decode.restart_at + 0.01)
        assert decode.state == WorkerState.STARTING and decode.spawn_reason == "restart"
        assert pool.seen["spawned"][-1] == "decode-0"
    _crash(pool, decode)
    assert decode.restart_at is None and pool.can_return("decode") is False
    assert "not restarted: 4 crashes in a row (workers.restart_limit = 3)" in decode.reason
    assert "no decode worker is ready: decode-0 crashed (was killed by signal 9; not restarted" \
        in pool.why_none_ready("decode")
    pool.spawn(decode)  # an operator starts it: the count starts afresh
    assert decode.crashes_in_a_row == 0 and decode.spawn_reason == "start"


@pytest.mark.parametrize("policy", [{"restart_backoff_ms": 500}])
def test_a_minute_of_being_ready_starts_the_crash_count_afresh(pool):
    pool.start_all()
    decode = pool["decode-0"]
    _crash(pool, decode)
    pool.watch(decode.restart_at + 0.01)
    _crash(pool, decode, ready_for=61.0)
    assert decode.crashes_in_a_row == 1 and "restarting in 0.5 s" in decode.reason


@pytest.mark.parametrize("policy", [{"restart": "never"}])
def test_restart_never_leaves_a_crashed_worker_down(pool):
    pool.start_all()
    prefill = pool["prefill-0"]
    _crash(pool, prefill)
    assert prefill.restart_at is None and "not restarted (workers.restart = never)" in prefill.reason
    pool.watch(time.monotonic() + 3600)
    assert prefill.state == WorkerState.CRASHED and not pool.can_return("prefill") and pool.can_return("decode")


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
