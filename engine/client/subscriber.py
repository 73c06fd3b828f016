"""TelemetrySubscriber: a SUB socket on the supervisor's telemetry endpoint."""

from __future__ import annotations

import zmq

from engine.wire.protocol import Message, ProtocolError, unpack
from engine.wire.sockets import drain, harden


class TelemetrySubscriber:
    def __init__(self, endpoint: str, topics: tuple[str, ...] = ("",), *, server_key: bytes | None = None,
                 client_keys: tuple[bytes, bytes] | None = None, context: zmq.Context | None = None):
        """topics: prefixes ("" = everything, "pages/" = every pool's pages, "metrics", ...)."""
        self._own_context = context is None
        self.ctx = context or zmq.Context()
        self.sock = harden(self.ctx.socket(zmq.SUB), "telemetry")
        if server_key is not None:
            from engine.wire.curve import secure_client

            secure_client(self.sock, server_key, *client_keys)
        for topic in topics:
            self.sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self.sock.connect(endpoint)
        self.dropped = 0  # frames that were not valid telemetry

    def recv(self, timeout_s: float = 1.0) -> Message | None:
        """The next telemetry message, or None when none came within timeout_s."""
        if not self.sock.poll(int(timeout_s * 1000)):
            return None
        return self.recv_nowait()

    def recv_nowait(self) -> Message | None:
        for frames in drain(self.sock):
            try:
                return unpack(frames[1:])
            except ProtocolError:
                self.dropped += 1
        return None

    def close(self) -> None:
        self.sock.close(linger=0)
        if self._own_context:
            self.ctx.term()
