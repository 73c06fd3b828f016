"""Fixtures of the worker tests: a real PrefillWorker wired to sockets the test holds."""

from __future__ import annotations

import pytest
import torch
import zmq

from engine.config import EngineConfig
from engine.wire.protocol import Message
from engine.workers import core_share
from engine.workers.prefill import PrefillWorker


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """A worker built in this process takes its share of the cores (CoreShare sets torch's
    threads): the next test gets the count it would have had."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def prefill_rig(tmp_path):
    """A real PrefillWorker with the supervisor's side of its bus and a decode worker's KV
    socket, both on ipc: (bus, kv, kv_endpoint, worker). The default copy model: its
    projections are too small for shared cores, so `worker.cores` is None."""
    yield from _rig(tmp_path)


@pytest.fixture
def shared_prefill_rig(tmp_path, monkeypatch):
    """prefill_rig with the copy model counted big enough to share the cores."""
    monkeypatch.setattr(core_share, "SHARE_MIN_BYTES", 0)
    yield from _rig(tmp_path)


def _rig(tmp_path):
    ctx = zmq.Context()
    bus = ctx.socket(zmq.ROUTER)
    bus.bind(f"ipc://{tmp_path}/bus")
    kv = ctx.socket(zmq.PULL)
    kv_endpoint = f"ipc://{tmp_path}/kv"
    kv.bind(kv_endpoint)
    worker = PrefillWorker("prefill-0", f"ipc://{tmp_path}/bus", "token", worker_config(), str(tmp_path))
    try:
        yield bus, kv, kv_endpoint, worker
    finally:
        worker.close()
        bus.close(0)
        kv.close(0)
        ctx.term()


def worker_config() -> EngineConfig:
    return EngineConfig().replace(model={"device": "cpu", "dtype": "float32"}, engine={"kernels": "torch"},
                                  canaries={"enabled": False})


def submit_prefill(worker, kv_endpoint: str, rid: str = "long", slot: int = 1, pages=(10, 11)) -> None:
    """Hand the worker one prefill job of a 21-token prompt, its pages reserved at `kv_endpoint`."""
    prompt = [256, *range(40, 60)]
    reservation = {"request_id": rid, "slot": slot, "epoch": 1, "tokens": len(prompt), "pages": list(pages),
                   "page_epochs": [1] * len(pages)}
    worker.handle(Message({"op": "prefill", "request_id": rid, "slot": slot, "prompt_ids": prompt,
                           "params": {"max_new_tokens": 4, "temperature": 0.0},
                           "target": {"endpoint": kv_endpoint, "reservation": reservation}}))
