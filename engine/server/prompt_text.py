"""Text prompts: a byte limit before any tokenizing, and tokenizing beside the loop, not on it.

A 4 MiB text prompt that admission would reject (context window 2,048) was tokenized on the
supervisor's loop first: every client's stream stalled 27 s and a control ping waited 33 s
(bench/hostile_inputs.py, 2-core machine). Now a text prompt of more bytes than
context_window x MAX_BYTES_PER_TOKEN is rejected before it is tokenized (it cannot fit the
window), and the others are tokenized in arrival order on one thread; the loop hears of each
result through a pipe it polls, and carries on with admission there.
"""

from __future__ import annotations

import os
import queue
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from engine.errors import AdmissionRejected, BudgetExceeded

# Real text averages 1 (byte-level vocabularies) to ~5 (English BPE) bytes a token; 32 leaves
# room for long runs of whitespace or code. A prompt that truly averages more can come as prompt_ids.
MAX_BYTES_PER_TOKEN = 32
MAX_TOKENIZING_BYTES = 64 << 20  # text waiting for the tokenizer thread, all clients together; past it: refused


def prompt_byte_limit(context_window: int) -> int:
    return context_window * MAX_BYTES_PER_TOKEN


def check_prompt_bytes(request_id: str, size: int, context_window: int) -> None:
    """Raises AdmissionRejected when a text prompt of `size` UTF-8 bytes cannot fit the window
    whatever its tokens, naming the size, the limit and how the limit is made."""
    limit = prompt_byte_limit(context_window)
    if size > limit:
        raise AdmissionRejected(
            f"request {request_id} rejected before tokenizing: the prompt is {size:,} bytes; the limit is {limit:,} "
            f"(context window {context_window:,} tokens x {MAX_BYTES_PER_TOKEN} bytes per token, more than any "
            f"tokenizer averages; a prompt that does can be sent as prompt_ids)",
            needed_tokens=-(-size // MAX_BYTES_PER_TOKEN), limit_tokens=context_window, limit_name="prompt_bytes")


@dataclass
class TokenizeJob:
    request_id: str
    text: str
    size: int  # UTF-8 bytes
    owner: str  # the submitting client (only it or an admin may cancel)
    encode: Callable[[str], list[int]]
    then: Callable[[TokenizeJob], None]  # called on the loop with the job once result is set
    result: list[int] | Exception | None = None
    cancelled: bool = False


class PromptTokenizer:
    """One thread that tokenizes text prompts in arrival order; `deliver()` (on the loop,
    when `fd` is readable) hands each finished job to its `then`."""

    def __init__(self, max_waiting_bytes: int = MAX_TOKENIZING_BYTES):
        self.max_waiting_bytes = max_waiting_bytes
        self.pending: dict[str, TokenizeJob] = {}  # request id -> job, until delivered
        self.waiting_bytes = 0
        self._jobs: queue.SimpleQueue[TokenizeJob | None] = queue.SimpleQueue()
        self._finished: deque[TokenizeJob] = deque()
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        self._thread: threading.Thread | None = None

    @property
    def fd(self) -> int:
        """Readable when a finished job waits for deliver()."""
        return self._wake_read

    def submit(self, job: TokenizeJob) -> None:
        """Queue a job. Raises BudgetExceeded when MAX_TOKENIZING_BYTES of text wait already."""
        if self.waiting_bytes + job.size > self.max_waiting_bytes:
            raise BudgetExceeded(f"request {job.request_id}: {self.waiting_bytes:,} bytes of text prompts are waiting "
                                 f"to be tokenized; {job.size:,} more would pass the limit {self.max_waiting_bytes:,} "
                                 f"(MAX_TOKENIZING_BYTES); try again shortly")
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="prompt-tokenizer", daemon=True)
            self._thread.start()
        self.pending[job.request_id] = job
        self.waiting_bytes += job.size
        self._jobs.put(job)

    def cancel(self, request_id: str) -> TokenizeJob | None:
        job = self.pending.get(request_id)
        if job is not None:
            job.cancelled = True
        return job

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                job.result = job.encode(job.text) if not job.cancelled else []
            except Exception as exc:  # noqa: BLE001 - handed to the loop, which answers the client
                job.result = exc
            self._finished.append(job)
            try:
                os.write(self._wake_write, b"!")
            except OSError:
                pass  # full of wake-ups already (the loop will look), or closed at shutdown

    def deliver(self, on_bug: Callable[[TokenizeJob, Exception], None]) -> None:
        """Hand every finished job to its `then`, in order (on the loop). A `then` that raises
        is reported through on_bug and the others still run."""
        try:
            while os.read(self._wake_read, 4096):
                pass
        except BlockingIOError:
            pass
        while self._finished:
            job = self._finished.popleft()
            self.pending.pop(job.request_id, None)
            self.waiting_bytes -= job.size
            job.text = ""  # the ids are what is kept
            try:
                job.then(job)
            except Exception as exc:  # noqa: BLE001 - one job's bug must not stop the loop
                on_bug(job, exc)

    def close(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)
        for fd in (self._wake_read, self._wake_write):
            os.close(fd)
