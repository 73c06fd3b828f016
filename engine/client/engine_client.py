"""EngineClient: requests and replies on the supervisor's control socket (a DEALER).

Every message carries an `id`; replies and stream events come back with it, so several
requests can be in flight on one client. Use a client from one thread only. The named
methods build their op's struct (engine/wire/messages/control.py); `send` and `call` take
any op by name with free fields, for ops and values no struct vouches for (hostile-input
tests, an older or newer engine).
"""

from __future__ import annotations

import itertools
import time
from collections import defaultdict, deque
from collections.abc import Iterator

import zmq

from engine.wire.messages import control
from engine.wire.messages.base import ControlCall
from engine.wire.messages.codec import header_of
from engine.wire.protocol import Message, ProtocolError, pack, unpack
from engine.wire.sockets import drain, harden

STREAM_END = ("done", "error")


class RemoteError(Exception):
    """The engine answered with an error; `code` is stable, the message says what to do."""

    def __init__(self, code: str, message: str, header: dict | None = None):
        super().__init__(message)
        self.code = code
        self.header = header or {}


class EngineClient:
    def __init__(self, endpoint: str, *, server_key: bytes | None = None,
                 client_keys: tuple[bytes, bytes] | None = None, timeout_s: float = 30.0,
                 context: zmq.Context | None = None):
        """server_key/client_keys: CURVE (z85 keys) for a remote engine; both or neither."""
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self._own_context = context is None
        self.ctx = context or zmq.Context()
        self.sock = harden(self.ctx.socket(zmq.DEALER), "control")
        if server_key is not None or client_keys is not None:
            if server_key is None or client_keys is None:
                raise ValueError("CURVE needs both the server's public key and a client key pair")
            from engine.wire.curve import secure_client

            secure_client(self.sock, server_key, *client_keys)
        self.sock.connect(endpoint)
        self._ids = itertools.count(1)
        self._inbox: dict[object, deque[Message]] = defaultdict(deque)

    def close(self) -> None:
        self.sock.close(linger=0)
        if self._own_context:
            self.ctx.term()

    def __enter__(self) -> "EngineClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- plumbing ---------------------------------------------------------------------
    def send(self, op: str, **fields) -> int:
        """Send one op by name, its fields as given; returns the id its answers will carry."""
        msg_id = next(self._ids)
        self.sock.send_multipart(pack({"op": op, "id": msg_id, **fields}), copy=False)
        return msg_id

    def send_message(self, message: ControlCall) -> int:
        """Send one typed op (its `id` is this client's next); returns that id."""
        msg_id = next(self._ids)
        self.sock.send_multipart(pack({**header_of(message), "id": msg_id}), copy=False)
        return msg_id

    def recv_for(self, msg_id, timeout_s: float | None = None) -> Message:
        """The next message carrying `msg_id` (others are kept for their own readers).

        Raises TimeoutError naming the endpoint when nothing comes in time."""
        if self._inbox.get(msg_id):
            return self._inbox[msg_id].popleft()
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sock.poll(int(left * 1000) + 1):
                raise TimeoutError(f"no answer from the engine at {self.endpoint} within "
                                   f"{self.timeout_s if timeout_s is None else timeout_s:.1f} s")
            for frames in drain(self.sock):
                try:
                    msg = unpack(frames)
                except ProtocolError:
                    continue  # a garbled answer is not ours to act on
                if msg.get("id") == msg_id or (msg.get("id") is None and msg.op == "error"):
                    return msg  # (an error without an id answers something this client sent)
                self._inbox[msg.get("id")].append(msg)

    def call(self, op: str, timeout_s: float | None = None, **fields) -> dict:
        """Send an op, wait for its reply; returns the result. Raises RemoteError or TimeoutError."""
        return self.call_with_arrays(op, timeout_s=timeout_s, **fields)[0]

    def call_with_arrays(self, op: str, timeout_s: float | None = None, **fields):
        return self._answer(self.send(op, **fields), timeout_s)

    def ask(self, message: ControlCall, timeout_s: float | None = None) -> dict:
        """Send a typed op, wait for its reply; returns the result. Raises RemoteError or TimeoutError."""
        return self.ask_with_arrays(message, timeout_s)[0]

    def ask_with_arrays(self, message: ControlCall, timeout_s: float | None = None):
        return self._answer(self.send_message(message), timeout_s)

    def _answer(self, msg_id: int, timeout_s: float | None):
        msg = self.recv_for(msg_id, timeout_s)
        if msg.op == "error":
            raise _remote_error(msg)
        return msg.get("result", {}), msg.arrays

    # ---- requests ---------------------------------------------------------------------
    def submit(self, prompt_ids: list[int] | None = None, *, prompt: str | None = None, **params) -> int:
        """Start a generation; returns the id of its event stream (see events()). `params`
        are control.Submit's fields (a None one is left out); raises TypeError for another."""
        fields = {k: v for k, v in params.items() if v is not None}
        if prompt_ids is not None:
            fields["prompt_ids"] = [int(t) for t in prompt_ids]
        if prompt is not None:
            fields["prompt"] = prompt
        return self.send_message(control.Submit(**fields))

    def events(self, stream_id, timeout_s: float | None = None) -> Iterator[Message]:
        """accepted, token..., then done (or error). Raises TimeoutError if the engine goes quiet."""
        while True:
            msg = self.recv_for(stream_id, timeout_s)
            yield msg
            if msg.op in STREAM_END:
                return

    def generate(self, prompt_ids: list[int] | None = None, *, prompt: str | None = None,
                 timeout_s: float | None = None, **params) -> dict:
        """Submit and wait for the end. Returns the `done` header (token_ids, text, ...).
        Raises RemoteError when it was rejected or failed."""
        for msg in self.events(self.submit(prompt_ids, prompt=prompt, stream=False, **params), timeout_s):
            if msg.op == "error":
                raise _remote_error(msg)
            if msg.op == "done":
                if msg.get("error"):
                    raise RemoteError(msg.get("error")["code"], msg.get("error")["message"], msg.header)
                return msg.header
        raise RuntimeError("unreachable")

    # ---- control ----------------------------------------------------------------------
    def status(self) -> dict:
        return self.ask(control.Status())

    def ping(self) -> dict:
        return self.ask(control.Ping())

    def start(self, worker: str) -> dict:
        return self.ask(control.Start(worker=worker))

    def stop(self, worker: str) -> dict:
        return self.ask(control.Stop(worker=worker))

    def restart(self, worker: str) -> dict:
        return self.ask(control.Restart(worker=worker))

    def reconfigure(self, changes: dict, *, apply: bool = False) -> dict:
        return self.ask(control.Reconfigure(changes=changes, apply=apply))

    def keyframe(self) -> dict:
        return self.ask(control.Keyframe())

    def page_metadata(self, pool: str) -> dict:
        """The pool's five metadata arrays as its worker holds them now."""
        result, arrays = self.ask_with_arrays(control.PageMetadata(pool=pool))
        return {k: v.copy() for k, v in arrays.items()}

    def audit(self, request_id: str) -> dict:
        return self.ask(control.Audit(request_id=request_id))

    def ack_alert(self, ids: list[str]) -> dict:
        return self.ask(control.AckAlert(ids=list(ids)))

    def cancel(self, request_id: str) -> dict:
        return self.ask(control.Cancel(request_id=request_id))


def _remote_error(msg: Message) -> RemoteError:
    error = msg.get("error") or {}
    return RemoteError(str(error.get("code", "error")), str(error.get("message", "")), msg.header)
