"""HttpFrontend: the aiohttp server in its own thread with its own event loop, so the
supervisor's loop never waits on an HTTP client (and the other way round)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter

from aiohttp import web

from engine.http.completions import HEADER_TIMEOUT_S, CompletionsApp
from engine.http.engine_link import EngineLink
from engine.http.prometheus_text import metrics_app
from engine.http.template_renderer import MAX_RENDER_CPU_S

START_TIMEOUT_S = 30.0
MAX_CONNECTIONS = 256  # open HTTP connections at once; past it: 503 and closed
# open connections from one peer address: one source that opens idle sockets cannot lock every
# other user out (it could take all 256 before); behind a proxy every client is the proxy's address
MAX_CONNECTIONS_PER_SOURCE = 128


class HttpFrontend:
    def __init__(self, control_endpoint: str, host: str = "127.0.0.1", port: int = 0, *,
                 curve: tuple[bytes, bytes, bytes] | None = None, header_timeout_s: float = HEADER_TIMEOUT_S,
                 max_connections: int = MAX_CONNECTIONS, max_per_source: int = MAX_CONNECTIONS_PER_SOURCE,
                 only_metrics: bool = False,
                 render_cpu_s: float = MAX_RENDER_CPU_S):
        """only_metrics: serve GET /metrics alone (serve --metrics-port). render_cpu_s: CPU
        seconds one chat template render may use (serve --chat-render-cpu-s)."""
        self.control_endpoint, self.host, self.port, self.curve = control_endpoint, host, port, curve
        self.render_cpu_s = render_cpu_s
        self.only_metrics = only_metrics
        self.header_timeout_s, self.max_connections = header_timeout_s, max_connections
        self.max_per_source = max_per_source
        self.capped: CappedConnections | None = None
        self.url: str | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def start(self) -> str:
        """Bind and serve; returns the base URL (http://HOST:PORT). Raises OSError when the
        address cannot be bound, TimeoutError when the server does not come up."""
        self._thread = threading.Thread(target=self._main, name="http-frontend", daemon=True)
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S):
            raise TimeoutError(f"the HTTP frontend did not start within {START_TIMEOUT_S:.0f} s")
        if self._error is not None:
            raise self._error
        return self.url

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # noqa: BLE001 - handed to start(), which raises it
            self._error = exc
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        link = EngineLink(self.control_endpoint, curve=self.curve)
        link.start()
        # handler_cancellation: a client that hangs up cancels its engine request at once,
        # not at the next token; the pages go back before that client's next request.
        app = metrics_app(link) if self.only_metrics else CompletionsApp(link, render_cpu_s=self.render_cpu_s).build()
        runner = web.AppRunner(app, access_log=None, handle_signals=False,
                               handler_cancellation=True, keepalive_timeout=self.header_timeout_s)
        await runner.setup()
        server = None
        try:
            self.capped = CappedConnections(runner.server, self.max_connections, self.max_per_source)
            server = await self._loop.create_server(self.capped, self.host, self.port)
            host, port = server.sockets[0].getsockname()[:2]
            self.port = port
            self.url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
            self._ready.set()
            await self._stop.wait()
        finally:
            if server is not None:
                server.close()
            await runner.cleanup()
            await link.close()


def _refuse(transport, body: bytes) -> None:
    """A connection past a cap: a 503 and closed, before any of its bytes are read."""
    transport.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                    b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    transport.close()


def _busy(message: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": "server_error",
                                 "code": "too_many_connections"}}).encode()


class CappedConnections:
    """aiohttp's protocol factory with caps on open connections (each costs a handler, its
    buffers and a timer), in total and per peer address: past either, a new connection is
    answered 503 and closed, and counted. The peer is known only once the connection is made,
    so each connection gets a gate that decides then and hands everything after to aiohttp's
    own handler."""

    def __init__(self, server: web.Server, limit: int, per_source: int = MAX_CONNECTIONS_PER_SOURCE):
        self.server, self.limit, self.per_source = server, limit, per_source
        self.refused = 0  # past the total
        self.refused_per_source = 0
        self.open_by_source: Counter[str] = Counter()

    def __call__(self) -> asyncio.Protocol:
        return _Gate(self)


class _Gate(asyncio.Protocol):
    def __init__(self, owner: CappedConnections):
        self.owner, self.inner, self.source = owner, None, None

    def connection_made(self, transport) -> None:
        owner = self.owner
        peer = transport.get_extra_info("peername")
        source = str(peer[0]) if isinstance(peer, (tuple, list)) and peer else "?"
        if len(owner.server.connections) >= owner.limit:
            owner.refused += 1
            return _refuse(transport, _busy(f"too many open connections to this server ({owner.limit:,}, the "
                                            "most it holds); try again later"))
        if owner.open_by_source[source] >= owner.per_source:
            owner.refused_per_source += 1
            return _refuse(transport, _busy(f"too many open connections from {source} ({owner.per_source:,}, "
                                            "the most one address may hold); close some and try again"))
        owner.open_by_source[source] += 1
        self.source, self.inner = source, owner.server()
        self.inner.connection_made(transport)

    def connection_lost(self, exc) -> None:
        if self.inner is None:
            return
        try:
            self.inner.connection_lost(exc)
        finally:
            counts = self.owner.open_by_source
            counts[self.source] -= 1
            if counts[self.source] <= 0:
                del counts[self.source]

    def data_received(self, data) -> None:
        if self.inner is not None:
            self.inner.data_received(data)

    def eof_received(self):
        return self.inner.eof_received() if self.inner is not None else None

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()
