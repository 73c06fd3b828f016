"""TemplateRenderer: chat templates rendered in render processes, never on the HTTP loop.

RENDER_PROCESSES processes (engine/http/template_worker.py), each started on first use and
rendering one request at a time; a chat request waits for a free one (at most
MAX_WAITING_RENDERS wait). Every render is bounded by its process: a CPU budget
(`serve --chat-render-cpu-s`), memory, recursion, and the template's output and operators
(engine/http/template_sandbox.py). A render that hits one is an HTTP 400 naming it; a render
whose client hung up is stopped by killing its process (the next request starts a fresh
one), and so is one that says nothing for its wall-clock bound.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import msgpack

from engine.http.openai_request import HttpError
from engine.http.template_worker import FRAME, MAX_FRAME_BYTES, MAX_RENDER_CPU_S, frame

RENDER_PROCESSES = 2  # renders at once: template work beside the engine's own on a small machine; more wait
MAX_WAITING_RENDERS = 64  # chat requests waiting for a render process (each holds up to 4 MiB); past it: 503
RENDER_WALL_FACTOR = 10  # a render silent for 10x its CPU budget (at least RENDER_WALL_MIN_S) is starved: killed
RENDER_WALL_MIN_S = 60.0  # ... and never less than this, which covers a fresh process's start on a loaded machine
REPO_ROOT = Path(__file__).resolve().parents[2]


class _ProcessEnded(Exception):
    pass


class RenderSlot:
    """One render process, started when first needed and again after it was killed."""

    def __init__(self):
        self.proc: asyncio.subprocess.Process | None = None

    async def exchange(self, request: dict) -> dict:
        if self.proc is None or self.proc.returncode is not None:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "engine.http.template_worker", str(os.getpid()), cwd=REPO_ROOT,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        proc = self.proc
        try:
            proc.stdin.write(frame(request))
            await proc.stdin.drain()
            (size,) = FRAME.unpack(await proc.stdout.readexactly(FRAME.size))
            if size > MAX_FRAME_BYTES:
                raise _ProcessEnded(f"an answer of {size:,} bytes")
            return msgpack.unpackb(await proc.stdout.readexactly(size), raw=False)
        except (asyncio.IncompleteReadError, BrokenPipeError, ConnectionResetError):
            raise _ProcessEnded(_ending(await proc.wait())) from None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.returncode is None else None

    def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()  # asyncio's child watcher reaps it
        self.proc = None


def _ending(returncode: int) -> str:
    if returncode < 0:
        return f"signal {signal.Signals(-returncode).name}"
    return f"exit status {returncode}"


class TemplateRenderer:
    def __init__(self, *, processes: int = RENDER_PROCESSES, cpu_s: float = MAX_RENDER_CPU_S,
                 max_waiting: int = MAX_WAITING_RENDERS):
        self.cpu_s, self.max_waiting = cpu_s, max_waiting
        self.wall_s = max(RENDER_WALL_MIN_S, RENDER_WALL_FACTOR * cpu_s)
        self.slots = [RenderSlot() for _ in range(processes)]
        self._idle: asyncio.Queue[RenderSlot] | None = None
        self.waiting = 0
        self.counts = {"rendered": 0, "limited": 0, "refused": 0, "busy": 0, "killed": 0}

    async def render(self, template, messages: list[dict]) -> str:
        """The prompt `template` (a chat.ChatTemplate) writes for `messages`. Raises HttpError:
        400 for a limit hit or a template that refused the messages, 503 when too many renders
        wait or a render process says nothing for wall_s, 500 when one ends for another reason."""
        if self._idle is None:
            self._idle = asyncio.Queue()
            for slot in self.slots:
                self._idle.put_nowait(slot)
        if self.waiting >= self.max_waiting:
            self.counts["busy"] += 1
            raise HttpError(503, f"{self.waiting} chat requests are waiting for a template render already; the "
                                 f"limit is {self.max_waiting}: try again shortly", code="render_busy",
                            kind="server_error")
        self.waiting += 1
        try:
            slot = await self._idle.get()
        finally:
            self.waiting -= 1
        request = {"origin": template.origin, "source": template.source, "bos_token": template.bos_token,
                   "eos_token": template.eos_token, "messages": messages, "cpu_s": self.cpu_s}
        try:
            reply = await asyncio.wait_for(slot.exchange(request), self.wall_s)
        except TimeoutError:
            self._kill(slot)
            raise HttpError(503, f"the chat template's render process answered nothing within {self.wall_s:g} s "
                                 "(the machine is starved?); it was stopped", code="render_timeout",
                            kind="server_error") from None
        except _ProcessEnded as exc:
            self._kill(slot)
            raise self._ended_error(template, str(exc)) from None
        except BaseException:  # cancelled: the client hung up, and its render stops with it
            self._kill(slot)
            raise
        finally:
            self._idle.put_nowait(slot)
        return self._text(template, reply)

    def _kill(self, slot: RenderSlot) -> None:
        self.counts["killed"] += 1
        slot.kill()

    def _ended_error(self, template, how: str) -> HttpError:
        if how == "signal SIGXCPU":  # RLIMIT_CPU: stuck inside one call past its CPU budget
            self.counts["limited"] += 1
            return HttpError(400, f"the chat template ({template.origin}) hit its cpu limit rendering these "
                                  f"messages: more than {self.cpu_s:g} s of CPU (serve --chat-render-cpu-s)",
                             param="messages", code="chat_template_limit")
        return HttpError(500, f"the chat template's render process ended ({how}) rendering these messages",
                         code="internal_error", kind="server_error")

    def _text(self, template, reply: dict) -> str:
        if "text" in reply:
            self.counts["rendered"] += 1
            return reply["text"]
        if "limit" in reply:
            self.counts["limited"] += 1
            raise HttpError(400, f"the chat template ({template.origin}) hit its {reply['limit']} limit rendering "
                                 f"these messages: {reply['message']}", param="messages", code="chat_template_limit")
        self.counts["refused"] += 1
        raise HttpError(400, f"the chat template ({template.origin}) refused these messages: {reply.get('refused')}",
                        param="messages")

    def pids(self) -> list[int]:
        """The render processes running now."""
        return [pid for pid in (slot.pid for slot in self.slots) if pid is not None]

    async def close(self) -> None:
        """Kill the render processes and wait until they are reaped (bounded), so that none
        outlives the loop that started it."""
        procs = [slot.proc for slot in self.slots if slot.proc is not None]
        for slot in self.slots:
            slot.kill()
        for proc in procs:
            try:
                await asyncio.wait_for(proc.wait(), 5.0)
            except TimeoutError:
                pass
