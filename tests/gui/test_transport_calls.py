"""Blocking calls from a worker thread go through the window's TransportThread (issue 13,
part 4): the snapshot export opens no socket of its own."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import zmq

from engine.client import RemoteError
from engine.wire.protocol import pack, unpack
from gui.transport import TransportClient, TransportThread


class FakeEngine:
    """A ROUTER that answers status, page_metadata and errors, and never answers 'slow'."""

    def __init__(self):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.peers: set[bytes] = set()
        self.ops: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self.sock.poll(20):
                continue
            identity, *frames = self.sock.recv_multipart()
            msg = unpack(frames)
            self.peers.add(identity)
            self.ops.append(msg.op)
            header, arrays = {"op": "reply", "id": msg.get("id"), "result": {}}, None
            if msg.op == "status":
                header["result"] = {"engine": {"version": "fake"}, "workers": []}
            elif msg.op == "page_metadata":
                arrays = {"owner": np.arange(4, dtype=np.int32), "state": np.ones(4, np.uint8)}
                header["result"] = {"pool": msg.get("pool")}
            elif msg.op == "boom":
                header = {"op": "error", "id": msg.get("id"), "error": {"code": "bad_op", "message": "no op boom"}}
            elif msg.op == "slow":
                continue
            self.sock.send_multipart([identity, *pack(header, arrays)])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close(linger=0)
        self.ctx.term()


@pytest.fixture
def engine():
    fake = FakeEngine()
    yield fake
    fake.close()


@pytest.fixture
def transport(qtbot, engine):
    thread = TransportThread(engine.endpoint)
    with qtbot.waitSignal(thread.connection, timeout=5000, check_params_cb=lambda s: s == "connected"):
        thread.start()
    yield thread
    thread.stop()


def in_worker(fn):
    """Run fn on a plain thread (as ExportJob does); returns its result or raises its error."""
    out = {}

    def body():
        try:
            out["value"] = fn()
        except Exception as exc:  # noqa: BLE001 - handed back to the test
            out["error"] = exc

    thread = threading.Thread(target=body)
    thread.start()
    thread.join(30)
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_worker_calls_are_answered_through_the_transports_one_socket(transport, engine):
    client = TransportClient(transport, timeout_s=5.0)
    assert in_worker(client.status) == {"engine": {"version": "fake"}, "workers": []}
    pages = in_worker(lambda: client.page_metadata("decode-0"))
    assert pages["owner"].tolist() == [0, 1, 2, 3] and pages["state"].tolist() == [1, 1, 1, 1]
    with pytest.raises(RemoteError, match="no op boom") as error:
        in_worker(lambda: client.call("boom"))
    assert error.value.code == "bad_op"
    assert len(engine.peers) == 1  # one DEALER: the transport's
    assert "page_metadata" in engine.ops


def test_a_call_waiting_when_the_transport_stops_fails_at_once(transport):
    client = TransportClient(transport, timeout_s=30.0)
    started = time.monotonic()
    worker_error = {}

    def wait_for_slow():
        try:
            client.call("slow")
        except Exception as exc:  # noqa: BLE001
            worker_error["error"] = exc

    thread = threading.Thread(target=wait_for_slow)
    thread.start()
    time.sleep(0.3)  # the op is on its way
    transport.stop()
    thread.join(10)
    assert isinstance(worker_error.get("error"), RemoteError)
    assert worker_error["error"].code == "transport_stopped" and time.monotonic() - started < 10
    with pytest.raises(RemoteError, match="closed"):
        client.status()  # a stopped transport answers nothing: refused at once
