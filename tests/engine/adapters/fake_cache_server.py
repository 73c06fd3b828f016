"""FakeCacheServer: a small OpenAI-compatible server (aiohttp, a real loopback socket, its
own thread) with a prefix cache of BLOCK-character blocks, for the salt check's tests.

Modes: "isolate" (a block is reused only under the same cache_salt, as vLLM), "share"
(salts ignored: one cache for all), "none" (no cache), "unreported" (isolates, but its
usage carries no prompt_tokens_details). A token is a character (plus a leading <s>, as a
byte-level tokenizer). Time to the first chunk: PER_TOKEN_S for every token not reused,
so a hit on a long prefix is several times faster, as a real prefill is.
"""

from __future__ import annotations

import asyncio
import json
import threading

from aiohttp import web

BLOCK = 16
PER_TOKEN_S = 60e-6  # 1,000 uncached tokens: 60 ms; a hit: about 1 ms
WINDOW = 2048
MODES = ("isolate", "share", "none", "unreported")
HOSTILE = ("long_line", "bad_count", "endless")  # answers past the client's limits


class FakeCacheServer:
    def __init__(self, mode: str = "isolate", hostile: str | None = None):
        assert mode in MODES and hostile in (None, *HOSTILE), (mode, hostile)
        self.mode, self.hostile = mode, hostile
        self.blocks: set[tuple[str | None, str]] = set()  # (namespace, prompt up to a block's end)
        self.bodies: list[dict] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="fake-cache-server", daemon=True)
        self.url = ""

    def __enter__(self) -> "FakeCacheServer":
        self._thread.start()
        assert self._ready.wait(10), "the fake server did not start"
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._completions)
        runner = web.AppRunner(app)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.run_until_complete(runner.cleanup())
            self._loop.close()

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake-copy", "max_model_len": WINDOW}]})

    def cached_and_store(self, prompt: str, salt: str | None) -> int:
        """Tokens reused from the cache (whole blocks, never the last token), then the
        prompt's blocks stored."""
        if self.mode == "none":
            return 0
        space = None if self.mode == "share" else salt
        tokens = len(prompt) + 1
        full = (tokens - 1) // BLOCK  # the last token is always computed
        hit = 0
        while hit < full and (space, prompt[:(hit + 1) * BLOCK - 1]) in self.blocks:
            hit += 1
        for k in range(1, full + 1):
            self.blocks.add((space, prompt[:k * BLOCK - 1]))
        return hit * BLOCK

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        prompt, salt = body["prompt"], body.get("cache_salt")
        tokens = len(prompt) + 1
        cached = self.cached_and_store(prompt, salt)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await asyncio.sleep((tokens - cached) * PER_TOKEN_S)
        if self.hostile == "long_line":
            await response.write(b"data: " + b"x" * 70_000 + b"\n\n")
        if self.hostile == "bad_count":
            cached = -5
        if self.hostile == "endless":  # chunks without text, until the client hangs up
            empty = _event({"choices": [{"index": 0, "text": "", "finish_reason": None}]})
            try:
                while True:
                    await response.write(empty * 64)
            except (ConnectionResetError, RuntimeError):  # the client went: aiohttp says either
                return response
        await response.write(_event({"choices": [{"index": 0, "text": "x", "finish_reason": None}]}))
        await response.write(_event({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]}))
        usage = {"prompt_tokens": tokens, "completion_tokens": 1, "total_tokens": tokens + 1}
        if self.mode != "unreported":
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        await response.write(_event({"choices": [], "usage": usage}))
        await response.write(b"data: [DONE]\n\n")
        return response


def _event(chunk: dict) -> bytes:
    return f"data: {json.dumps(chunk)}\n\n".encode()
