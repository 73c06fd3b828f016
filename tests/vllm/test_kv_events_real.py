"""`watch-kv-events` against a real vLLM 0.32 (CPU build): the block count our watcher ends with
equals the count vLLM's own decoder keeps, with batches dropped on the way (filled from vLLM's
replay endpoint), and for a watcher that starts late (history fetched on connect)."""

from __future__ import annotations

import concurrent.futures as cf
import json
import subprocess
import threading
import time
from pathlib import Path

import pytest
import zmq

from engine.adapters.kv_event_watch import KvEventWatcher
from tests.vllm.vllm_server import VllmServer, vllm_python

pytestmark = pytest.mark.vllm

TRUTH = Path(__file__).with_name("vllm_kv_truth.py")


class LossyProxy:
    """Forwards vLLM's KV-event PUB to a PUB of its own, dropping every `drop_every`-th batch."""

    def __init__(self, source: str, sink: str, drop_every: int):
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(source)
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.bind(sink)
        self.drop_every, self.forwarded, self.dropped = drop_every, 0, 0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            if not self.sub.poll(50):
                continue
            frames = self.sub.recv_multipart()
            n += 1
            if n % self.drop_every == 0:
                self.dropped += 1
                continue
            self.pub.send_multipart(frames)
            self.forwarded += 1

    def close(self) -> None:
        self._stop.set()
        self.thread.join(5)
        self.sub.close(0)
        self.pub.close(0)
        self.ctx.term()


class Truth:
    """vLLM's own decoder (tests/vllm/vllm_kv_truth.py) under vLLM's interpreter."""

    def __init__(self, endpoint: str):
        self.proc = subprocess.Popen([str(vllm_python()), str(TRUTH), endpoint], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"
        time.sleep(1.0)  # the subscription reaches the publisher before any event is published

    def now(self) -> dict:
        self.proc.stdin.write("?\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
        self.proc.stdout.close()


def workload(server: VllmServer, n: int, seed: int) -> None:
    prompts = [f"request {seed}-{i} " + "the quick brown fox jumps over the lazy dog " * (1 + i % 6) for i in range(n)]
    with cf.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda p: server.complete(p, 8 + len(p) % 40), prompts))


def watch_until(watcher: KvEventWatcher, predicate, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not predicate():
        watcher.poll(100)
    watcher.run_for(1.0)


@pytest.fixture(scope="module")
def vllm_with_events():
    """A vLLM publishing KV events, and vLLM's own decoder watching it from before the first event."""
    with VllmServer(kv_events=True, num_blocks=128, max_model_len=512) as server:
        truth = Truth(server.kv_pub)
        try:
            yield server, truth
        finally:
            truth.close()


def test_dropped_batches_are_filled_from_replay_and_the_count_equals_vllms_own(vllm_with_events, tmp_path):
    server, truth = vllm_with_events
    proxy = LossyProxy(server.kv_pub, f"ipc://{tmp_path}/lossy", drop_every=5)
    try:
        with KvEventWatcher([f"ipc://{tmp_path}/lossy"], [server.kv_replay]) as watcher:
            watcher.run_for(1.5)  # connected, history fetched (nothing yet)
            workload(server, 60, seed=1)
            watch_until(watcher, lambda: proxy.forwarded + proxy.dropped > 0 and
                        watcher.state.summary()["batches"] >= proxy.forwarded + proxy.dropped)
            summary = watcher.state.summary()
    finally:
        proxy.close()
    vllm = truth.now()
    assert vllm["first_seq"] == 0 and vllm["gaps"] == 0, vllm  # the truth itself saw everything
    assert proxy.dropped >= 3
    assert summary["gaps"] >= 1 and summary["replays"] >= 1 and summary["replay_failures"] == 0
    assert summary["gaps_unfilled"] == 0 and summary["refused"] == 0 and summary["replay_refused"] == 0
    assert summary["ranks"]["0"]["blocks"] == vllm["blocks"], (summary, vllm)
    assert 0 < vllm["blocks"] <= 127


def test_a_watcher_started_late_fetches_the_history_vllm_still_buffers(vllm_with_events):
    server, truth = vllm_with_events
    workload(server, 12, seed=2)  # events this watcher is too late for (and the other test's before them)
    vllm = truth.now()
    assert vllm["first_seq"] == 0 and vllm["gaps"] == 0 and vllm["batches"] > 0, vllm
    with KvEventWatcher([server.kv_pub], [server.kv_replay]) as watcher:
        watcher.run_for(3.0)
        summary = watcher.state.summary()
    assert summary["history_fetches"] >= 1 and summary["history_failures"] == 0
    assert summary["history_batches"] == vllm["batches"]  # all of them: far below vLLM's 10,000-step buffer
    assert summary["replay_refused"] == 0 and summary["refused"] == 0
    assert summary["ranks"]["0"]["blocks"] == vllm["blocks"] > 0, (summary, vllm)
