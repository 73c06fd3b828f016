"""A forward pass longer than the liveness timers is not taken for a hung worker, nor its
supervisor for a gone one. On CPU a 2,000-token prompt on a 135M-class model prefills in
22 s (bench/RESULTS.md); the supervisor kills a worker silent for 30 s, and a worker that
heard nothing for 15 s exits. Heartbeats now also go out after each layer of a forward, and
a worker with the supervisor's messages waiting unread is not orphaned. Real PrefillWorker,
real model, real ipc sockets; the layers are slowed down so the forward takes 0.6 s and the
timers are scaled down with it."""

from __future__ import annotations

import time

import pytest

import engine.workers.loop as worker_loop
from engine.model.layers import DecoderLayer
from engine.wire.protocol import pack, unpack
from tests.engine.workers.conftest import submit_prefill

LAYER_S = 0.3


@pytest.fixture
def slow_layers(monkeypatch):
    real = DecoderLayer.forward

    def forward(self, *args, **kwargs):
        time.sleep(LAYER_S)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(DecoderLayer, "forward", forward)


def test_heartbeats_keep_going_inside_a_long_forward_pass(prefill_rig, slow_layers, monkeypatch):
    bus, kv, kv_endpoint, worker = prefill_rig
    monkeypatch.setattr(worker_loop, "HEARTBEAT_S", 0.1)
    layers = len(worker.engine.model.decoder.model.layers)
    submit_prefill(worker, kv_endpoint)
    worker._last_heartbeat = time.monotonic()
    start = time.monotonic()
    worker.work()  # one prefill: `layers` x 0.3 s
    assert time.monotonic() - start >= layers * LAYER_S
    said = []
    while bus.poll(1000):
        said.append(unpack(bus.recv_multipart()[1:]).op)
        if said[-1] == "prefilled":
            break
    assert said[-1] == "prefilled"
    assert said.count("heartbeat") >= layers  # one after each layer, all before the forward's answer


def test_a_worker_with_the_supervisors_messages_unread_after_a_long_forward_is_not_orphaned(
        prefill_rig, slow_layers, monkeypatch):
    bus, kv, kv_endpoint, worker = prefill_rig
    monkeypatch.setattr(worker_loop, "ORPHAN_S", 0.4)
    worker.send(worker.hello())
    identity = bus.recv_multipart()[0]
    submit_prefill(worker, kv_endpoint)
    bus.send_multipart([identity, *pack({"op": "ping"})])  # arrives while the worker computes
    worker._last_heard = time.monotonic()
    worker.work()  # longer than ORPHAN_S; the ping waits unread on the bus
    worker._periodic()
    assert not worker.stopping
    worker._drain_bus()
    worker._periodic()
    assert not worker.stopping  # heard: the clock starts again
    worker._last_heard = time.monotonic() - 1.0  # and truly nothing for longer than ORPHAN_S: gone
    worker._periodic()
    assert worker.stopping
