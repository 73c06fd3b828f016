"""TransportThread: the one thread that owns every ZeroMQ socket of the GUI.

It polls the control DEALER and the telemetry SUB with a short timeout (never a busy
NOBLOCK loop), decodes telemetry, and hands it to the GUI thread in batches (at most one
signal per BATCH_S, so a flood of messages costs a handful of signal emits). Commands from
the GUI thread arrive through a queue and leave through the one EngineClient; answers come
back as signals carrying the ticket that request() returned. A worker thread (the snapshot
export) that needs blocking calls gets them through a TransportClient: its commands take
the same queue and their answers come back on a queue of their own. It asks for status
twice a second, which is also how it tells a live engine from a gone one.
"""

from __future__ import annotations

import itertools
import queue
import time

import zmq
from PySide6.QtCore import QThread, Signal

from engine.client import EngineClient, RemoteError, TelemetrySubscriber
from engine.wire.protocol import Message, ProtocolError, unpack
from engine.wire.sockets import drain

POLL_MS = 20
BATCH_S = 0.05
STATUS_EVERY_S = 0.5
FULL_STATUS_EVERY_S = 5.0  # config and alerts too; the others are brief
NO_ANSWER_S = 2.0  # a status unanswered for this long: the engine is gone (reconnecting)
CALL_TIMEOUT_S = 60.0


class TransportThread(QThread):
    telemetry = Signal(list)  # [Message, ...]
    status = Signal(dict)
    reply = Signal(int, str, object)  # ticket, op, result dict or {"error": {code, message}}
    stream_event = Signal(object)  # Message of a submit stream (accepted / token / done / error)
    connection = Signal(str)  # "connecting" | "connected" | "reconnecting"

    def __init__(self, endpoint: str, *, server_key: bytes | None = None,
                 client_keys: tuple[bytes, bytes] | None = None, telemetry_endpoint: str | None = None,
                 parent=None):
        """telemetry_endpoint: overrides the one the engine's status names (soak tests)."""
        super().__init__(parent)
        self.endpoint = endpoint
        self.server_key, self.client_keys = server_key, client_keys
        self.telemetry_override = telemetry_endpoint
        self._commands: queue.Queue = queue.Queue()
        self._tickets = itertools.count(1)
        self._running = True
        self.received = 0  # telemetry messages decoded (read from tests after the thread ends)
        self.dropped = 0

    # ---- called from the GUI thread -----------------------------------------------------
    def request(self, op: str, **fields) -> int:
        """Queue one control op; its answer comes as reply(ticket, op, result)."""
        ticket = next(self._tickets)
        self._commands.put((ticket, op, fields, None))
        return ticket

    # ---- called from a worker thread (never the GUI thread: it blocks) ------------------
    def call(self, op: str, timeout_s: float = CALL_TIMEOUT_S, **fields) -> tuple[dict, dict]:
        """Send one op through this thread's client and wait for its answer: (result, arrays).
        Raises RemoteError for an error answer, TimeoutError when none comes in time."""
        if not self._running or self.isFinished():
            raise RemoteError("transport_stopped", f"the connection to {self.endpoint} was closed")
        answer: queue.Queue = queue.Queue(maxsize=1)
        self._commands.put((next(self._tickets), op, fields, answer))
        try:
            msg = answer.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(f"no answer to {op} from the engine at {self.endpoint} within {timeout_s:.1f} s") \
                from None
        if msg.op == "error":
            error = msg.get("error") or {}
            raise RemoteError(str(error.get("code", "error")), str(error.get("message", "")), msg.header)
        return msg.get("result", {}), msg.arrays

    def stop(self) -> None:
        self._running = False
        self.wait(5000)

    # ---- the thread -------------------------------------------------------------------
    def run(self) -> None:
        ctx = zmq.Context()
        client = EngineClient(self.endpoint, server_key=self.server_key, client_keys=self.client_keys,
                              context=ctx)
        sub: TelemetrySubscriber | None = None
        sub_endpoint = None
        pending: dict[int, tuple[int, str, queue.Queue | None]] = {}  # message id -> (ticket, op, answer queue)
        streams: set[int] = set()
        batch: list = []
        last_flush = last_status = last_full = 0.0
        status_sent_at: float | None = None
        state = "connecting"
        self.connection.emit(state)
        poller = zmq.Poller()
        poller.register(client.sock, zmq.POLLIN)
        try:
            while self._running:
                now = time.monotonic()
                if now - last_status >= STATUS_EVERY_S and status_sent_at is None:
                    brief = now - last_full < FULL_STATUS_EVERY_S and state == "connected"
                    pending[client.send("status", brief=brief)] = (0, "status", None)
                    last_status = status_sent_at = now
                    last_full = last_full if brief else now
                if status_sent_at is not None and now - status_sent_at > NO_ANSWER_S and state != "reconnecting":
                    state = "reconnecting"
                    self.connection.emit(state)
                    status_sent_at = None  # ask again; the DEALER reconnects on its own
                self._send_commands(client, pending, streams)
                ready = dict(poller.poll(POLL_MS))
                if client.sock in ready:
                    for msg in _drain(client.sock):
                        msg_id = msg.get("id")
                        if msg_id in streams:
                            self.stream_event.emit(msg)
                            if msg.op in ("done", "error"):
                                streams.discard(msg_id)
                            continue
                        ticket, op, answer = pending.pop(msg_id, (None, None, None))
                        if answer is not None:  # a worker thread's call: the message itself
                            answer.put(msg)
                        elif op == "status":
                            status_sent_at = None
                            if msg.op == "reply":
                                result = msg.get("result", {})
                                if state != "connected":
                                    state = "connected"
                                    self.connection.emit(state)
                                endpoint = self.telemetry_override or result.get("engine", {}).get("telemetry")
                                if endpoint and endpoint != sub_endpoint:
                                    sub = self._resubscribe(ctx, poller, sub, endpoint)
                                    sub_endpoint = endpoint
                                    pending[client.send("keyframe")] = (0, "keyframe", None)
                                self.status.emit(result)
                        elif ticket is not None and ticket > 0:
                            result = msg.get("result", {}) if msg.op == "reply" else {"error": msg.get("error")}
                            self.reply.emit(ticket, op, result)
                if sub is not None and sub.sock in ready:
                    batch.extend(self._drain_sub(sub))
                if batch and (now - last_flush >= BATCH_S or len(batch) >= 5000):
                    self.telemetry.emit(batch)
                    batch, last_flush = [], now
        finally:
            self._fail_waiting_calls(pending)
            if batch:
                self.telemetry.emit(batch)
            if sub is not None:
                sub.sock.close(linger=0)
            client.sock.close(linger=0)
            ctx.term()

    def _send_commands(self, client: EngineClient, pending: dict, streams: set) -> None:
        while True:
            try:
                ticket, op, fields, answer = self._commands.get_nowait()
            except queue.Empty:
                return
            msg_id = client.send(op, **fields)
            if op == "submit" and answer is None:
                streams.add(msg_id)
                self.reply.emit(ticket, op, {"stream": msg_id})
            else:
                pending[msg_id] = (ticket, op, answer)

    def _fail_waiting_calls(self, pending: dict) -> None:
        """The thread ends: worker threads waiting on a call get an error now, not a timeout."""
        gone = Message({"op": "error", "error": {"code": "transport_stopped",
                                                 "message": f"the connection to {self.endpoint} was closed"}})
        waiting = [answer for _ticket, _op, answer in pending.values() if answer is not None]
        while True:
            try:
                waiting.append(self._commands.get_nowait()[3])
            except queue.Empty:
                break
        for answer in waiting:
            if answer is not None:
                answer.put(gone)

    def _resubscribe(self, ctx, poller, sub, endpoint: str) -> TelemetrySubscriber:
        if sub is not None:
            poller.unregister(sub.sock)
            sub.sock.close(linger=0)
        sub = TelemetrySubscriber(endpoint, ("",), server_key=self.server_key, client_keys=self.client_keys,
                                  context=ctx)
        poller.register(sub.sock, zmq.POLLIN)
        return sub

    def _drain_sub(self, sub: TelemetrySubscriber) -> list:
        out = []
        for _ in range(20_000):  # bounded: the GUI thread must get its batch
            msg = sub.recv_nowait()
            if msg is None:
                break
            out.append(msg)
        self.received += len(out)
        self.dropped = sub.dropped
        return out


def _drain(sock: zmq.Socket) -> list:
    out = []
    for frames in drain(sock):
        try:
            out.append(unpack(frames))
        except ProtocolError:
            continue
    return out


class TransportClient:
    """The blocking calls the snapshot collector needs (EngineClient's status, call,
    call_with_arrays, page_metadata), answered through a running TransportThread, so that
    the transport stays the one owner of the window's sockets. Use it from a worker
    thread, never the GUI thread."""

    def __init__(self, transport: TransportThread, timeout_s: float = CALL_TIMEOUT_S):
        self.transport = transport
        self.timeout_s = timeout_s
        self.endpoint = transport.endpoint

    def call_with_arrays(self, op: str, timeout_s: float | None = None, **fields) -> tuple[dict, dict]:
        """Raises RemoteError or TimeoutError."""
        return self.transport.call(op, self.timeout_s if timeout_s is None else timeout_s, **fields)

    def call(self, op: str, timeout_s: float | None = None, **fields) -> dict:
        return self.call_with_arrays(op, timeout_s, **fields)[0]

    def status(self) -> dict:
        return self.call("status")

    def page_metadata(self, pool: str) -> dict:
        """The pool's metadata arrays as its worker holds them now (copies)."""
        _result, arrays = self.call_with_arrays("page_metadata", pool=pool)
        return {k: v.copy() for k, v in arrays.items()}
