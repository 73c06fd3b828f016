"""The OpenAI-compatible routes: POST /v1/completions and /v1/chat/completions (JSON or
SSE) and GET /v1/models.

Each HTTP request is one engine request on the shared EngineLink. A rejection arrives
before any byte of the answer, so even a streaming request gets a plain HTTP 400 with the
engine's message; an error after the stream began is one `data: {"error": ...}` chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from pathlib import Path

from aiohttp import web

from engine.http.chat import ChatTemplate, load_template, parse_chat
from engine.http.engine_link import EngineError, EngineLink
from engine.http.openai_request import CompletionRequest, HttpError, parse_completion
from engine.http.prometheus_text import metrics_handler
from engine.http.stop_filter import StopFilter
from engine.http.template_renderer import MAX_RENDER_CPU_S, TemplateRenderer

MAX_BODY_BYTES = 32 << 20  # a prompt of 2 Mi token ids as JSON
IDLE_TIMEOUT_S = 300.0  # the engine said nothing about a request for this long: 504
# A connection that has not sent a whole request within this long is closed (aiohttp's
# keep-alive timer runs from the connection's start and is not reset by partial headers: a
# client trickling header bytes held its connection forever, 300 of them stayed open).
HEADER_TIMEOUT_S = 15.0
MODEL_INFO_TTL_S = 2.0
CLIENT_CODES = {"invalid_request": 400, "admission_rejected": 400, "bad_message": 400}
BUSY_CODES = {"worker_crashed": 503, "worker_stopped": 503, "transfer_timeout": 503, "pool_exhausted": 503,
              "no_worker": 503, "budget_exceeded": 429}
FINISH = {"eos": "stop", "stop": "stop", "length": "length"}
log = logging.getLogger(__name__)


def parse_json_body(raw: bytes):
    """The request body as JSON, or HttpError 400 naming what is wrong with it: not JSON,
    nested deeper than Python's parser goes (a 100,000-deep array raised RecursionError: 500),
    or a number with more digits than Python converts (4,300; a 5,000-digit one: 500)."""
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HttpError(400, f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise HttpError(400, "the request body nests arrays or objects too deeply to parse "
                             "(a completion request needs at most 3 levels)") from None
    except ValueError as exc:  # int() refusing a number longer than sys.get_int_max_str_digits()
        raise HttpError(400, f"the request body holds a number that cannot be read: {exc}") from None


def engine_http_error(code: str, message: str) -> HttpError:
    status = CLIENT_CODES.get(code) or BUSY_CODES.get(code) or 500
    kind = "invalid_request_error" if status == 400 else "server_error"
    return HttpError(status, message, code=code, kind=kind)


class CompletionsApp:
    def __init__(self, link: EngineLink, *, idle_timeout_s: float = IDLE_TIMEOUT_S,
                 render_cpu_s: float = MAX_RENDER_CPU_S):
        self.link, self.idle_timeout_s = link, idle_timeout_s
        self.renderer = TemplateRenderer(cpu_s=render_cpu_s)
        self._info: tuple[float, dict] | None = None
        self._info_call: asyncio.Future | None = None  # the one status call in flight for model_info
        self._template: tuple[str, ChatTemplate] | None = None  # (model path, its chat template)
        self._cancels: set[asyncio.Task] = set()

    def build(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_errors_as_json])
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", metrics_handler(self.link))
        app.on_cleanup.append(self._close)
        return app

    async def _close(self, app: web.Application) -> None:
        await self.renderer.close()

    # ---- /v1/models -------------------------------------------------------------------
    async def model_info(self) -> dict:
        """The served model's name and context window (from the engine's status, cached briefly).
        Requests that find it stale at once share one status call: a burst of 64 arriving just
        after it expired made 64 calls, each a status report the engine had to build."""
        if self._info is not None and time.monotonic() - self._info[0] <= MODEL_INFO_TTL_S:
            return self._info[1]
        if self._info_call is None or self._info_call.done():
            self._info_call = asyncio.ensure_future(self._fetch_model_info())
        return await asyncio.shield(self._info_call)

    async def _fetch_model_info(self) -> dict:
        status = await self.link.call("status")
        engine = status["engine"]
        template = self.chat_template(engine["model"])
        info = {"id": Path(engine["model"]).name, "object": "model",
                "created": int(time.time() - engine["uptime_s"]), "owned_by": "pagewarden",
                "max_model_len": status["config"]["engine"]["context_window"], "chat_template": template.origin}
        self._info = (time.monotonic(), info)
        return info

    def chat_template(self, model_path: str) -> ChatTemplate:
        """The served checkpoint's chat template (read once per model path)."""
        if self._template is None or self._template[0] != model_path:
            self._template = (model_path, load_template(Path(model_path) if model_path else None))
        return self._template[1]

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [await self.model_info()]})

    # ---- /v1/completions --------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = parse_json_body(await request.read())
        return await self._complete(request, parse_completion(body), await self.model_info(), chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        """Every field is checked before the render; the render runs in a render process
        (engine/http/template_renderer.py), so this loop serves everyone else meanwhile."""
        chat = parse_chat(parse_json_body(await request.read()))
        info = await self.model_info()
        prompt = await self.renderer.render(self._template[1], chat.messages)  # model_info loaded the template
        return await self._complete(request, chat.completion(prompt), info, chat=True)

    async def _complete(self, request: web.Request, req: CompletionRequest, info: dict, *,
                        chat: bool) -> web.StreamResponse:
        if req.model is not None and req.model != info["id"]:
            raise HttpError(404, f"model {req.model!r} is not served here; this engine serves {info['id']!r}",
                            param="model", code="model_not_found")
        created = int(time.time())
        rid = f"http-{uuid.uuid4().hex[:16]}"  # ours, so a hang-up can cancel it even before `accepted`
        # the peer's address names this HTTP client to the engine's fair queue: HTTP clients take
        # turns among themselves within the front's own turn
        fields = {**req.submit_fields(), "request_id": rid, "client": str(request.remote or "")[:128]}
        async with contextlib.aclosing(self.link.stream(fields, self.idle_timeout_s)) as events:
            try:
                first = await anext(events)
                if first.op == "error":
                    error = first.get("error") or {}
                    raise engine_http_error(str(error.get("code", "error")), str(error.get("message", "")))
                head = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{rid}", "created": created, "model": info["id"]}
                if req.stream:
                    return await self._stream(request, req, events, rid, head, chat)
                return await self._whole(req, events, rid, head, chat)
            except (asyncio.CancelledError, ConnectionResetError):
                self._cancel_later(rid)  # the client went away: stop generating for nobody
                raise

    async def _run(self, req: CompletionRequest, events, rid: str, emit) -> tuple[str, dict]:
        """Feed token text through the stop filter to `emit`; returns (finish_reason, usage).
        A stop sequence cancels the engine request; its `done` still brings the counts."""
        stops = StopFilter(req.stop)
        sent = ""
        async for msg in events:
            if msg.op == "token" and msg.get("text") and not stops.stopped:
                sent += msg.get("text")
                await emit(stops.feed(msg.get("text")))
                if stops.stopped:
                    await self._cancel(rid)
            elif msg.op == "error":
                error = msg.get("error") or {}
                raise engine_http_error(str(error.get("code", "error")), str(error.get("message", "")))
            elif msg.op == "done":
                if stops.stopped:
                    return "stop", _usage(msg)
                if msg.get("error"):
                    raise engine_http_error(msg.get("error")["code"], msg.get("error")["message"])
                text = msg.get("text") or ""
                rest = text[len(sent):] if text.startswith(sent) else ""  # held back at the end
                await emit(stops.feed(rest))
                await emit(stops.flush())
                reason = "stop" if stops.stopped else FINISH.get(msg.get("finish_reason"), msg.get("finish_reason"))
                return reason, _usage(msg)
        raise HttpError(502, f"the engine ended request {rid} without an answer", code="engine_error",
                        kind="server_error")

    async def _whole(self, req, events, rid: str, head: dict, chat: bool) -> web.Response:
        parts: list[str] = []

        async def emit(text: str) -> None:
            parts.append(text)

        reason, usage = await self._run(req, events, rid, emit)
        text = "".join(parts)
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
        kind = "chat.completion" if chat else "text_completion"
        return web.json_response({**head, "object": kind, "choices": [choice], "usage": usage})

    async def _stream(self, request: web.Request, req, events, rid: str, head: dict,
                      chat: bool) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        head = {**head, "object": "chat.completion.chunk" if chat else "text_completion"}

        async def chunk(text: str, reason: str | None = None, role: bool = False) -> None:
            if chat:  # deltas: the role first, then content, then the finish reason alone
                delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text else {})
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
            else:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
            await _sse(response, {**head, "choices": [choice]})

        if chat:
            await chunk("", role=True)

        async def emit(text: str) -> None:
            if text:
                await chunk(text)

        try:
            reason, usage = await self._run(req, events, rid, emit)
        except (HttpError, TimeoutError) as exc:  # the status line is sent: the error is a chunk
            error = exc if isinstance(exc, HttpError) else HttpError(504, str(exc), code="timeout", kind="server_error")
            await _sse(response, error.body())
        except ConnectionResetError:
            raise  # the client left: completions() cancels the engine request
        except Exception as exc:  # a bug of ours
            log.exception("streamed completion %s failed", rid)
            await _sse(response, HttpError(500, f"internal error: {type(exc).__name__}: {exc}",
                                           code="internal_error", kind="server_error").body())
        else:
            await chunk("", reason)
            if req.include_usage:
                await _sse(response, {**head, "choices": [], "usage": usage})
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    # ---- cancelling -------------------------------------------------------------------
    async def _cancel(self, rid: str) -> None:
        with contextlib.suppress(EngineError, TimeoutError):
            await self.link.call("cancel", request_id=rid)

    def _cancel_later(self, rid: str) -> None:
        task = asyncio.get_running_loop().create_task(self._cancel(rid))
        self._cancels.add(task)  # keep a reference until it ran
        task.add_done_callback(self._cancels.discard)


def _usage(done) -> dict:
    prompt, completion = int(done.get("prompt_len") or 0), len(done.get("token_ids") or [])
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            # as vLLM reports it (with --enable-prompt-tokens-details): what the prefix cache held
            "prompt_tokens_details": {"cached_tokens": int(done.get("cached_tokens") or 0)}}


async def _sse(response: web.StreamResponse, payload: dict) -> None:
    await response.write(f"data: {json.dumps(payload)}\n\n".encode())


@web.middleware
async def _errors_as_json(request: web.Request, handler):
    """Every failure is an OpenAI error object: ours, the engine's, aiohttp's own (404, 413)."""
    try:
        return await handler(request)
    except HttpError as exc:
        return web.json_response(exc.body(), status=exc.status)
    except TimeoutError as exc:
        return web.json_response(HttpError(504, str(exc), code="timeout", kind="server_error").body(), status=504)
    except EngineError as exc:
        error = engine_http_error(exc.code, str(exc))
        return web.json_response(error.body(), status=error.status)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        kind = "invalid_request_error" if exc.status < 500 else "server_error"
        body = HttpError(exc.status, f"{request.method} {request.path}: {exc.reason}", code=str(exc.status),
                         kind=kind).body()
        return web.json_response(body, status=exc.status)
    except Exception as exc:  # a bug of ours: the traceback to the log, an error object to the client
        log.exception("HTTP %s %s failed", request.method, request.path)
        body = HttpError(500, f"internal error: {type(exc).__name__}: {exc}", code="internal_error",
                         kind="server_error").body()
        return web.json_response(body, status=500)
