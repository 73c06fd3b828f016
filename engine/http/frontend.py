"""HttpFrontend: the aiohttp server in its own thread with its own event loop, so the
supervisor's loop never waits on an HTTP client (and the other way round)."""

from __future__ import annotations

import asyncio
import threading

from aiohttp import web

from engine.http.completions import HEADER_TIMEOUT_S, CompletionsApp
from engine.http.engine_link import EngineLink

START_TIMEOUT_S = 30.0


class HttpFrontend:
    def __init__(self, control_endpoint: str, host: str = "127.0.0.1", port: int = 0, *,
                 curve: tuple[bytes, bytes, bytes] | None = None, header_timeout_s: float = HEADER_TIMEOUT_S):
        self.control_endpoint, self.host, self.port, self.curve = control_endpoint, host, port, curve
        self.header_timeout_s = header_timeout_s
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
        runner = web.AppRunner(CompletionsApp(link).build(), access_log=None, handle_signals=False,
                               handler_cancellation=True, keepalive_timeout=self.header_timeout_s)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.host, self.port)
            await site.start()
            host, port = runner.addresses[0][:2]
            self.port = port
            self.url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
            self._ready.set()
            await self._stop.wait()
        finally:
            await runner.cleanup()
            await link.close()
