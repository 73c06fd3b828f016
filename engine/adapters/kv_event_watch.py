"""KvEventWatcher: SUB sockets on engines' KV-event endpoints feeding a KvEventState, with
sequence-gap detection and replay.

Replay, as the engines serve it (vllm-project/vllm vllm/distributed/kv_events.py
ZmqEventPublisher._service_replay; sgl-project/sglang
python/sglang/srt/disaggregation/kv_events.py, the same code): the ROUTER takes a request
of 3 frames (identity, empty delimiter, 8-byte big-endian start seq), answers one message
(identity, empty, seq, payload) per buffered batch with seq >= start, in buffer order, then
(identity, empty, END, b"") with END = -1 as 8 signed big-endian bytes. The buffer keeps
the last `buffer_steps` (default 10,000) batches; a ROUTER drops replies beyond its send
HWM, so a very long replay can lose its tail, and the end marker with it.
Where the brief said otherwise: a REQ socket (used by vLLM's example subscriber and its test
MockSubscriber) receives only the FIRST of those answers: libzmq's REQ accepts one reply per
request and discards the rest (checked here with pyzmq 27 / libzmq 4.3.5). So the watcher
asks with a DEALER that sends the empty delimiter itself: to the ROUTER it is the same
3-frame request, and it receives every answer. Like a REQ it is recreated after a timeout
(LINGER 0), so late answers of an abandoned replay never mix into the next one.

The watcher connects to any tcp:// or ipc:// address the user names (this is a client of
someone else's engine; PageWarden's loopback-only rule is for its own endpoints).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import zmq

from engine.adapters.kv_event_decode import (
    MAX_PAYLOAD_BYTES,
    KvEventError,
    check_dialect,
    decode_frames,
    decode_replay_frames,
)
from engine.adapters.kv_event_state import KvEventState
from engine.wire.sockets import drain

REPLAY_TIMEOUT_MS = 2000
MAX_DRAIN = 10_000  # messages taken from one socket per poll, so one stream cannot starve others
MAX_REPLAY_ANSWERS = 100_000
RCVHWM = 10_000
# Twice the decoder's limit: a payload a little over it still reaches the decoder, which
# names its size; libzmq drops the connection for anything larger, before buffering it.
MAX_FRAME = 2 * MAX_PAYLOAD_BYTES
WILDCARD_HOSTS = ("*", "0.0.0.0", "[::]", "::")


def check_address(address: str) -> str:
    """`address` when it is tcp://HOST:PORT or ipc://PATH; KvEventError naming it otherwise."""
    scheme, sep, rest = str(address).partition("://")
    if not sep:
        raise KvEventError(f"address {address!r} has no scheme; expected tcp://HOST:PORT or ipc://PATH")
    if scheme == "ipc":
        if not rest:
            raise KvEventError(f"address {address!r} has no path; expected ipc://PATH")
        return address
    if scheme != "tcp":
        raise KvEventError(f"address {address!r}: scheme {scheme!r} is not supported; expected tcp:// or ipc://")
    host, colon, port = rest.rpartition(":")
    if not colon or not host:
        raise KvEventError(f"address {address!r} has no host or port; expected tcp://HOST:PORT")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise KvEventError(f"address {address!r}: port {port!r} is not in 1..65535")
    if host in WILDCARD_HOSTS:
        raise KvEventError(f"address {address!r}: {host} is the engine's bind wildcard; connect to the engine's "
                           f"host instead, e.g. tcp://127.0.0.1:{port}")
    return address


@dataclass
class _Stream:
    endpoint: str
    sub: zmq.Socket
    replay_endpoint: str | None
    replay_sock: zmq.Socket | None = None
    last_seq: int | None = None  # highest seq received (applied or refused)


class KvEventWatcher:
    """Watches `endpoints` (one SUB each, all topics); `replay[i]` is endpoint i's replay
    ROUTER or None. Raises KvEventError for a bad address, dialect or replay list."""

    def __init__(self, endpoints: list[str], replay: list[str | None] | None = None, dialect: str = "auto",
                 state: KvEventState | None = None, *, replay_timeout_ms: int = REPLAY_TIMEOUT_MS,
                 context: zmq.Context | None = None):
        self.dialect = check_dialect(dialect)
        endpoints = [check_address(e) for e in endpoints]
        if not endpoints:
            raise KvEventError("no endpoint to watch; give at least one tcp:// or ipc:// address")
        if len(set(endpoints)) != len(endpoints):
            raise KvEventError(f"endpoints {endpoints} name one address twice")
        replay = list(replay or [])
        if len(replay) > len(endpoints):
            raise KvEventError(f"{len(replay)} replay addresses for {len(endpoints)} endpoints; at most one each")
        replay += [None] * (len(endpoints) - len(replay))
        replay = [None if r is None else check_address(r) for r in replay]
        if replay_timeout_ms <= 0:
            raise KvEventError(f"replay timeout {replay_timeout_ms} ms must be more than 0")
        self.state = state if state is not None else KvEventState()
        self.replay_timeout_ms = replay_timeout_ms
        self._own_context = context is None
        self._ctx = context or zmq.Context()
        self._poller = zmq.Poller()
        self._streams: list[_Stream] = []
        for endpoint, replay_endpoint in zip(endpoints, replay):
            sub = self._socket(zmq.SUB)
            sub.setsockopt(zmq.RCVHWM, RCVHWM)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.connect(endpoint)
            self._poller.register(sub, zmq.POLLIN)
            self._streams.append(_Stream(endpoint, sub, replay_endpoint))

    @property
    def endpoints(self) -> list[str]:
        return [s.endpoint for s in self._streams]

    def _socket(self, kind: int) -> zmq.Socket:
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME)
        return sock

    def poll(self, timeout_ms: int) -> int:
        """Wait up to timeout_ms for messages, then take every one waiting (MAX_DRAIN per
        socket). Undecodable frames are counted in the state, never raised. Returns how
        many messages were taken."""
        ready = dict(self._poller.poll(timeout_ms))
        taken = 0
        for stream in self._streams:
            if stream.sub not in ready:
                continue
            for frames in drain(stream.sub, MAX_DRAIN, copy=True):
                self._receive(stream, frames)
                taken += 1
        return taken

    def run_for(self, seconds: float) -> None:
        """poll() until `seconds` have passed."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.poll(max(1, min(200, int(left * 1000))))

    def _receive(self, stream: _Stream, frames: list[bytes]) -> None:
        try:
            batch, error = decode_frames(frames, self.dialect), None
        except KvEventError as exc:
            batch, error = None, exc
        seq = batch.seq if batch is not None else error.seq
        if seq is None:  # not even a readable seq: refused, and the stream position is unknown
            self.state.record_refusal(stream.endpoint, str(error))
            return
        if stream.last_seq is not None:
            if seq == 0:  # replays never start at 0, so a live 0 after anything is a restart
                self.state.record_restart(stream.endpoint)
                stream.last_seq = None
            elif seq <= stream.last_seq:
                self.state.record_duplicate()
                return
            elif seq > stream.last_seq + 1:
                expected = stream.last_seq + 1
                filled = stream.replay_endpoint is not None and self._replay(stream, expected, seq)
                self.state.record_gap(stream.endpoint, expected, seq, filled)
                if seq <= stream.last_seq:  # the replay brought this batch already
                    self.state.record_duplicate()
                    return
        self._accept(stream, seq, batch, error)

    def _accept(self, stream: _Stream, seq: int, batch, error: KvEventError | None) -> None:
        if error is not None:
            self.state.record_refusal(stream.endpoint, f"seq {seq}: {error}", seq)
        else:
            self.state.apply(batch, stream.endpoint)
        stream.last_seq = seq

    def _replay(self, stream: _Stream, start: int, got: int) -> bool:
        """Ask stream's replay ROUTER for every batch from `start`, apply the new ones in seq
        order, and say whether start..got-1 all came."""
        if stream.replay_sock is None:
            stream.replay_sock = self._socket(zmq.DEALER)
            stream.replay_sock.setsockopt(zmq.RCVHWM, 0)  # a replay is one burst: never drop its tail
            stream.replay_sock.connect(stream.replay_endpoint)
        sock = stream.replay_sock
        answers, complete = [], False
        deadline = time.monotonic() + self.replay_timeout_ms / 1000
        try:
            sock.send_multipart([b"", start.to_bytes(8, "big")], zmq.NOBLOCK)
            while len(answers) < MAX_REPLAY_ANSWERS:
                left_ms = int((deadline - time.monotonic()) * 1000)
                if left_ms <= 0 or not sock.poll(left_ms):
                    break
                frames = sock.recv_multipart()
                if frames and frames[0] == b"":
                    frames = frames[1:]  # the delimiter a REQ would have stripped
                try:
                    batch = decode_replay_frames(frames, self.dialect)
                except KvEventError as exc:
                    if exc.seq is None:
                        self.state.record_refusal(stream.endpoint, f"replay: {exc}")
                    else:
                        answers.append((exc.seq, None, exc))
                    continue
                if batch is None:
                    complete = True
                    break
                answers.append((batch.seq, batch, None))
        except zmq.Again:
            pass  # could not even queue the request: counts as a failed replay
        if not complete:
            sock.close(linger=0)
            stream.replay_sock = None
        answers.sort(key=lambda answer: answer[0])
        due = start
        for seq, batch, error in answers:
            if seq == due:
                due += 1
            if stream.last_seq is None or seq > stream.last_seq:
                self._accept(stream, seq, batch, error)
        self.state.record_replay(len(answers), complete)
        return due >= got

    def close(self) -> None:
        for stream in self._streams:
            stream.sub.close(linger=0)
            if stream.replay_sock is not None:
                stream.replay_sock.close(linger=0)
        if self._own_context:
            self._ctx.term()

    def __enter__(self) -> KvEventWatcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
