"""EngineLink: the HTTP frontend's one asyncio DEALER to the supervisor's control socket.

Every message carries an `id`; a reader task hands each answer to the queue of the call
or stream waiting for that id, so any number of HTTP requests share one socket. msgpack
only (engine.wire.protocol), never pickle.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import zmq
import zmq.asyncio

from engine.wire.protocol import Message, ProtocolError, pack, unpack
from engine.wire.sockets import harden

STREAM_END = ("done", "error")


class EngineError(Exception):
    """The engine answered with an error: `code` is the engine's stable code."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


class EngineLink:
    def __init__(self, endpoint: str, *, curve: tuple[bytes, bytes, bytes] | None = None):
        """curve: (server public, client public, client secret) z85 keys for a CURVE engine."""
        self.endpoint = endpoint
        self.ctx = zmq.asyncio.Context()
        self.sock = harden(self.ctx.socket(zmq.DEALER), "control")
        if curve is not None:
            from engine.wire.curve import secure_client

            secure_client(self.sock, *curve)
        self.sock.connect(endpoint)
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Queue] = {}
        self._reader: asyncio.Task | None = None
        self.garbled = 0  # answers that did not unpack (counted, never acted on)

    def start(self) -> None:
        """Start the reader; call from inside the event loop that will use this link."""
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            try:
                await self._reader
            except asyncio.CancelledError:
                pass
        self.sock.close(linger=0)
        self.ctx.term()

    async def _read(self) -> None:
        while True:
            frames = await self.sock.recv_multipart(copy=False)
            try:
                msg = unpack(frames)
            except ProtocolError:
                self.garbled += 1
                continue
            queue = self._waiting.get(msg.get("id"))
            if queue is not None:  # an answer nobody waits for (a cancelled stream) is dropped
                queue.put_nowait(msg)

    async def _send(self, op: str, fields: dict) -> tuple[int, asyncio.Queue]:
        msg_id = next(self._ids)
        queue: asyncio.Queue = asyncio.Queue()
        self._waiting[msg_id] = queue
        await self.sock.send_multipart(pack({"op": op, "id": msg_id, **fields}), copy=False)
        return msg_id, queue

    async def _next(self, queue: asyncio.Queue, timeout_s: float) -> Message:
        try:
            return await asyncio.wait_for(queue.get(), timeout_s)
        except asyncio.TimeoutError:
            raise TimeoutError(f"no answer from the engine at {self.endpoint} within {timeout_s:.0f} s") from None

    async def call(self, op: str, timeout_s: float = 30.0, **fields) -> dict:
        """One op, its reply's result. Raises EngineError or TimeoutError."""
        msg_id, queue = await self._send(op, fields)
        try:
            msg = await self._next(queue, timeout_s)
        finally:
            self._waiting.pop(msg_id, None)
        if msg.op == "error":
            raise _engine_error(msg)
        return msg.get("result", {})

    async def stream(self, fields: dict, idle_timeout_s: float) -> AsyncIterator[Message]:
        """Submit a request and yield accepted, token..., done (or error); without
        `stream: true` in fields, accepted then done. Raises TimeoutError when the engine says
        nothing for `idle_timeout_s` (for a request that streams) or does not answer a ping
        after that long (for one that does not: it is silent until done, however long it
        runs). A caller that stops early should cancel the request (its later answers are
        dropped)."""
        msg_id, queue = await self._send("submit", fields)
        try:
            while True:
                try:
                    msg = await self._next(queue, idle_timeout_s)
                except TimeoutError:
                    if fields.get("stream", True):
                        raise
                    await self.call("ping", timeout_s=idle_timeout_s)  # alive: keep waiting
                    continue
                yield msg
                if msg.op in STREAM_END:
                    return
        finally:
            self._waiting.pop(msg_id, None)


def _engine_error(msg: Message) -> EngineError:
    error = msg.get("error") or {}
    return EngineError(str(error.get("code", "error")), str(error.get("message", "")))
