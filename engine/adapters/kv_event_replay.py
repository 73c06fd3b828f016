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
"""

from __future__ import annotations

from dataclasses import dataclass, field

import zmq

from engine.adapters.kv_event_decode import Batch, KvEventError, decode_replay_frames

MAX_REPLAY_ANSWERS = 100_000


@dataclass
class ReplayAnswer:
    seq: int
    batch: Batch | None  # None when the payload was refused (error says why)
    error: KvEventError | None
    digest: int  # of the payload: tells the batch we hold from a restarted engine's same seq


@dataclass
class ReplayResult:
    start: int
    answers: list[ReplayAnswer] = field(default_factory=list)  # in seq order
    refusals: list[str] = field(default_factory=list)  # answers without even a readable seq
    complete: bool = False  # the end marker came
    problem: str | None = None  # why it is not complete, naming the endpoint

    def has(self, seq: int, digest: int | None) -> bool:
        """Whether batch `seq` came, with `digest` when that is known."""
        return any(a.seq == seq and (digest is None or a.digest == digest) for a in self.answers)


class ReplayClient:
    """One engine's replay endpoint. `make_socket(kind)` gives a socket with the watcher's
    options; `timeout_ms` is the longest silence accepted before the end marker."""

    def __init__(self, endpoint: str, make_socket, timeout_ms: int, dialect: str = "auto"):
        self.endpoint = endpoint
        self.timeout_ms = timeout_ms
        self.dialect = dialect
        self._make_socket = make_socket
        self._sock: zmq.Socket | None = None

    def fetch(self, start: int) -> ReplayResult:
        """Every batch the engine still buffers from `start` on. Never raises for what the
        engine sends or fails to send: refusals and the reason for an incomplete replay are
        in the result."""
        if self._sock is None:
            self._sock = self._make_socket(zmq.DEALER)
            self._sock.setsockopt(zmq.RCVHWM, 0)  # a replay is one burst: never drop its tail
            self._sock.connect(self.endpoint)
        result = ReplayResult(start)
        try:
            self._sock.send_multipart([b"", start.to_bytes(8, "big")], zmq.NOBLOCK)
            self._collect(result)
        except zmq.Again:  # could not even queue the request
            result.problem = f"replay request to {self.endpoint} could not be queued"
        if not result.complete:
            self._sock.close(linger=0)
            self._sock = None
        result.answers.sort(key=lambda answer: answer.seq)
        return result

    def _collect(self, result: ReplayResult) -> None:
        taken = 0
        while taken < MAX_REPLAY_ANSWERS:
            if not self._sock.poll(self.timeout_ms):
                result.problem = self._silence(taken)
                return
            frames = [bytes(f) for f in self._sock.recv_multipart()]
            taken += 1
            if frames and frames[0] == b"":
                frames = frames[1:]  # the delimiter a REQ would have stripped
            try:
                batch = decode_replay_frames(frames, self.dialect)
            except KvEventError as exc:
                if exc.seq is None:
                    result.refusals.append(str(exc))
                else:
                    result.answers.append(ReplayAnswer(exc.seq, None, exc, hash(frames[-1])))
                continue
            if batch is None:
                result.complete = True
                return
            result.answers.append(ReplayAnswer(batch.seq, batch, None, hash(frames[-1])))
        result.problem = f"replay from {self.endpoint} sent more than {MAX_REPLAY_ANSWERS:,} answers; stopped"

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
