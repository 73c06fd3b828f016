"""ReplayClient: asks an engine's KV-event replay ROUTER for the batches from a start seq.

The request (vllm-project/vllm and sgl-project/sglang vllm/distributed/kv_events.py,
python/sglang/srt/disaggregation/kv_events.py, ZmqEventPublisher._service_replay) is one
8-byte big-endian start seq behind an empty delimiter; the ROUTER answers one message per
buffered batch with seq >= start, then an end marker. Two answer forms are in the field,
told apart per message by decode_replay_frames: vLLM since PR #45177 (v0.26; 0.32 sends
it) repeats the topic, (topic, seq, payload) and (b"", END, b""); SGLang and older vLLM
send (seq, payload) and (END, b"").

A DEALER, not a REQ: a REQ keeps only the first answer of a request (libzmq allows one
reply per request). After a timeout the DEALER is closed (LINGER 0) and made again, so the
late answers of an abandoned replay never mix into the next one.

Each answer is handed to the caller as it arrives (decoded, then dropped): nothing piles up.
libzmq reads at most REPLAY_RCVHWM answers ahead; the engine's ROUTER queues the rest (vLLM:
1,000) and drops what does not fit, so an answer missing in mid-stream, or a stream that
stalls before its end marker, means "ask again from the first one missing" (a round), not
"the engine lacks it". The first answer of a round may start later than asked: that hole is
the engine's (its buffer no longer holds those batches). The bytes taken by one fetch are
bounded (max_bytes), and so are its answers and rounds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import zmq

from engine.adapters.kv_event_decode import Batch, KvEventError, decode_replay_frames

MAX_REPLAY_ANSWERS = 100_000  # ten times vLLM's replay buffer (10,000 batches)
# Payload bytes one fetch takes: vLLM's 10,000 buffered batches of ~20 KB; what a hostile
# ROUTER can make the watcher decode before it stops listening.
MAX_REPLAY_BYTES = 256 * 1024 * 1024
REPLAY_RCVHWM = 16  # answers libzmq may hold unread: 16 frames of at most ~2 MiB
MAX_REPLAY_ROUNDS = 64  # asking again after answers the engine dropped: ~1,000 more each round
STALL_MS = 250  # silence in mid-stream: the engine's loop sends without pause, so its tail was dropped


@dataclass
class ReplayAnswer:
    seq: int | None  # None when not even the seq frame was readable (error says why)
    batch: Batch | None  # None when the payload was refused (error says why)
    error: KvEventError | None
    digest: int  # of the payload: tells the batch we hold from a restarted engine's same seq


@dataclass
class ReplayResult:
    start: int
    answers: int = 0  # handed to the caller, refused ones included
    bytes: int = 0
    rounds: int = 0
    complete: bool = False  # the end marker came
    stopped: bool = False  # the caller asked to stop
    problem: str | None = None  # why it is not complete, naming the endpoint and the limit


class ReplayClient:
    """One engine's replay endpoint. `make_socket(kind)` gives a socket with the watcher's
    options; `timeout_ms` is the longest wait for a first answer; `max_bytes` bounds what
    one fetch takes."""

    def __init__(self, endpoint: str, make_socket, timeout_ms: int, dialect: str = "auto",
                 max_bytes: int = MAX_REPLAY_BYTES):
        self.endpoint = endpoint
        self.timeout_ms = timeout_ms
        self.dialect = dialect
        self.max_bytes = max_bytes
        self._make_socket = make_socket
        self._sock: zmq.Socket | None = None

    def fetch(self, start: int, take: Callable[[ReplayAnswer], bool]) -> ReplayResult:
        """Every batch the engine still buffers from `start` on, each handed to `take` as it
        comes, in seq order; `take` returns False to stop there. Never raises for what the
        engine sends or fails to send: the reason for an incomplete replay is in the result."""
        result = ReplayResult(start)
        due = start
        while not (result.complete or result.stopped or result.problem):
            if result.rounds == MAX_REPLAY_ROUNDS:
                result.problem = (f"replay from {self.endpoint} needed more than {MAX_REPLAY_ROUNDS} rounds "
                                  f"(answers dropped on the way); stopped before seq {due:,}")
                break
            result.rounds += 1
            due = self._round(due, result, take)
        if not result.complete:
            self.close()  # its late answers must never reach the next fetch
        return result

    def _round(self, due: int, result: ReplayResult, take) -> int:
        """Ask from `due` and hand over answers until the end marker, a stop, a limit, or a
        hole the engine's dropping made (the next round asks from it). Returns the new due."""
        if self._sock is None:
            self._sock = self._make_socket(zmq.DEALER)
            self._sock.setsockopt(zmq.RCVHWM, REPLAY_RCVHWM)
            self._sock.connect(self.endpoint)
        try:
            self._sock.send_multipart([b"", due.to_bytes(8, "big")], zmq.NOBLOCK)
        except zmq.Again:
            result.problem = f"replay request to {self.endpoint} could not be queued"
            return due
        taken = 0  # answers with a seq this round
        while True:
            if not self._sock.poll(self.timeout_ms if not taken else min(self.timeout_ms, STALL_MS)):
                if not taken:  # nothing new at all: no progress to make
                    result.problem = self._silence(result.answers)
                else:
                    self.close()  # its tail was dropped: ask again from there
                return due
            frames = [bytes(f) for f in self._sock.recv_multipart()]
            result.bytes += sum(map(len, frames))
            if result.bytes > self.max_bytes:
                result.problem = (f"replay from {self.endpoint} sent more than {self.max_bytes:,} bytes "
                                  f"({result.answers:,} answers); stopped")
                return due
            if result.answers >= MAX_REPLAY_ANSWERS:
                result.problem = f"replay from {self.endpoint} sent more than {MAX_REPLAY_ANSWERS:,} answers; stopped"
                return due
            answer = self._read(frames)
            if answer is None:
                result.complete = True
                return due
            if answer.seq is not None:
                if taken and answer.seq != due:  # the engine dropped answers on the way
                    self.close()
                    return due
                if answer.seq < due:  # an engine's answer older than asked for: not a batch to apply
                    continue
                taken += 1
                due = answer.seq + 1
            result.answers += 1
            if not take(answer):
                result.stopped = True
                return due

    def _read(self, frames: list[bytes]) -> ReplayAnswer | None:
        """One answer, or None for the end marker."""
        if frames and frames[0] == b"":
            frames = frames[1:]  # the delimiter a REQ would have stripped
        try:
            batch = decode_replay_frames(frames, self.dialect)
        except KvEventError as exc:
            return ReplayAnswer(exc.seq, None, exc, hash(frames[-1]) if frames else 0)
        if batch is None:
            return None
        return ReplayAnswer(batch.seq, batch, None, hash(frames[-1]))

    def _silence(self, taken: int) -> str:
        seconds = self.timeout_ms / 1000
        if not taken:
            return (f"no replay answer from {self.endpoint} within {seconds:.1f} s: is the engine's replay "
                    "endpoint bound there?")
        return (f"replay from {self.endpoint} went silent for {seconds:.1f} s after {taken} answers, "
                "without its end marker")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None
