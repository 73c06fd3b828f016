"""A real DecodeWorker (its own loop thread, its own sockets) driven by this test acting as
the supervisor on a real bus: I3 (a transfer that does not match its reservation fails the
request, scrubs and frees its pages, raises an alert) and I4 (a transfer arriving after
the reservation was released is dropped and reported, never written)."""

from __future__ import annotations

import secrets
import tempfile
import threading
import time

import numpy as np
import pytest
import torch
import zmq

from engine.config import EngineConfig
from engine.kv.page_pool import PageLayout, PagePool
from engine.wire.protocol import pack, unpack
from engine.workers.decode import DecodeWorker
from engine.workers.transfer.send import build_transfer

pytestmark = pytest.mark.e2e  # real engine processes


PROMPT = [256] + list(range(40, 60))  # 21 tokens: 2 pages of 16


class Harness:
    def __init__(self, tiny_model):
        self.run_dir = tempfile.mkdtemp(prefix="pw-dw-")
        self.ctx = zmq.Context()
        self.bus = self.ctx.socket(zmq.ROUTER)
        self.bus.setsockopt(zmq.LINGER, 0)
        endpoint = f"ipc://{self.run_dir}/bus"
        self.bus.bind(endpoint)
        config = EngineConfig().replace(model={"device": "cpu"}, engine={"kernels": "torch"},
                                        pools={"decode": {"pages": 8}})
        self.token = secrets.token_hex(8)
        # the worker loads the shared tiny model itself, as in its own process
        self.worker = DecodeWorker("decode-t", endpoint, self.token, config, self.run_dir)
        self.thread = threading.Thread(target=self.worker.run, daemon=True)
        self.thread.start()
        self.hello = self.expect("hello")
        self.push = self.ctx.socket(zmq.PUSH)
        self.push.setsockopt(zmq.LINGER, 0)
        self.push.connect(self.hello.get("transfer_endpoint"))
        layout = self.worker.engine.pool.layout
        self.prefill = PagePool("prefill-t", 8, PageLayout(layout.num_layers, layout.num_kv_heads, layout.head_dim,
                                                            layout.page_size, layout.dtype))
        self.prefill.data.normal_()

    def send(self, header: dict) -> None:
        self.bus.send_multipart([b"decode-t", *pack(header)])

    def expect(self, *ops: str, timeout_s: float = 60.0):
        """Next message with one of `ops` (heartbeats and others are skipped)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.bus.poll(100):
                msg = unpack(self.bus.recv_multipart()[1:])
                if msg.op in ops:
                    return msg
        raise TimeoutError(f"no {ops} from the worker")

    def reserve(self, request_id: str, slot: int):
        self.send({"op": "reserve", "request_id": request_id, "slot": slot, "prompt_ids": PROMPT,
                   "params": {"max_new_tokens": 4, "ignore_eos": True}})
        return self.expect("reserved", "reserve_failed")

    def transfer(self, reserved, *, corrupt: bool = False) -> None:
        grant = self.prefill.allocate(99, 2)
        messages = build_transfer(self.prefill, grant.pages, reserved.get("reservation"), first_token=7)
        for frames in messages:
            frames = [bytes(memoryview(f)) for f in frames]
            if corrupt:
                frames[1] = bytes([frames[1][0] ^ 0xFF]) + frames[1][1:]  # a page frame
            self.push.send_multipart(frames)
        self.prefill.free(99, grant.pages)

    def metadata(self):
        self.send({"op": "page_metadata", "ask_id": 1})
        return self.expect("page_metadata").arrays

    def close(self):
        self.send({"op": "stop"})
        self.thread.join(timeout=10)
        self.push.close()
        self.bus.close()
        self.ctx.term()


@pytest.fixture
def harness(tiny_model):
    h = Harness(tiny_model)
    yield h
    h.close()


def test_a_verified_transfer_joins_the_batch(harness):
    reserved = harness.reserve("ok", slot=3)
    assert reserved.op == "reserved"
    harness.transfer(reserved)
    done = harness.expect("transfer_done")
    assert done.get("ok") is True
    tokens = harness.expect("tokens")
    assert tokens.get("items")[0] == ["ok", [7]]  # the first token came with the transfer


def test_a_corrupted_page_fails_the_request_scrubs_and_frees(harness):
    reserved = harness.reserve("bad", slot=4)
    pages = reserved.get("reservation")["pages"]
    harness.transfer(reserved, corrupt=True)
    alert = harness.expect("alert")
    assert alert.get("kind") == "transfer_mismatch" and "checksum" in alert.get("detail")
    done = harness.expect("transfer_done")
    assert done.get("ok") is False and done.get("error")["code"] == "transfer_mismatch"
    assert "pages were scrubbed and freed" in done.get("error")["message"]
    meta = harness.metadata()
    assert (meta["owner"][pages] == -1).all() and (meta["state"][pages] == 0).all()
    pool = harness.worker.engine.pool
    assert bool((pool.data[torch.tensor(pages)] == 0).all())  # scrubbed


def test_a_transfer_after_release_is_dropped_and_reported(harness):
    first = harness.reserve("gone", slot=5)
    harness.send({"op": "cancel", "request_id": "gone"})
    time.sleep(0.2)
    meta = harness.metadata()
    pages = first.get("reservation")["pages"]
    assert (meta["owner"][pages] == 5).all()  # I4: held while the prefill side may still send
    harness.send({"op": "release", "request_id": "gone"})
    harness.expect("released")
    # the pages go to someone else, whose transfer lands and who runs to the end
    second = harness.reserve("next", slot=6)
    assert set(second.get("reservation")["pages"]) & set(pages)  # the same pages, reused
    harness.transfer(second)
    assert harness.expect("transfer_done").get("ok") is True
    while "next" not in [f[0] for f in harness.expect("tokens").get("finished")]:
        pass
    before = harness.worker.engine.pool.data.clone()
    meta_before = harness.metadata()
    harness.transfer(first)  # late: for a reservation that no longer exists
    alert = harness.expect("alert")
    assert alert.get("kind") == "late_write_dropped" and alert.get("requests") == ["gone"]
    meta_after = harness.metadata()
    assert torch.equal(harness.worker.engine.pool.data, before)  # not one byte written
    for key in meta_before:
        np.testing.assert_array_equal(meta_after[key], meta_before[key])
