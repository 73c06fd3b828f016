"""KvEventWatcher: SUB sockets on engines' KV-event endpoints feeding a KvEventState, with
history on (re)connect, sequence-gap detection and replay (kv_event_replay.py holds the
replay wire forms: vLLM 0.26+ answers (topic, seq, payload), SGLang and older vLLM
(seq, payload); each answer is read by its frame count, never by configuration).

- History: when a SUB connects (a socket monitor reports it), the watcher asks the replay
  endpoint for everything from seq 0, so a watcher started late holds what the engine's
  replay buffer (vLLM: the last 10,000 batches) says is cached, not only what came after.
- Reconnect: it asks again from the last seq it applied. When the engine still has that
  batch (same seq, same payload) the stream goes on; otherwise the engine restarted (its
  counter began again) and the history is fetched from 0.
- Gap: a live seq past the next one due asks for the missing ones. Batches already applied
  (by seq) are skipped, whether they come live or by replay.
- A replay answer that cannot be decoded is counted apart from refused live frames.
- A replay endpoint that does not answer, and a live endpoint nothing accepts connections
  on (a SUB connecting there waits silently forever), become notices naming the endpoint.

The watcher connects to any tcp:// or ipc:// address the user names (this is a client of
someone else's engine; PageWarden's loopback-only rule is for its own endpoints).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import zmq
from zmq.utils.monitor import recv_monitor_message

from engine.adapters.kv_event_decode import MAX_PAYLOAD_BYTES, KvEventError, check_dialect, decode_frames
from engine.adapters.kv_event_replay import ReplayAnswer, ReplayClient
from engine.adapters.kv_event_state import KvEventState
from engine.wire.sockets import drain

REPLAY_TIMEOUT_MS = 2000
MAX_DRAIN = 10_000  # messages taken from one socket per poll, so one stream cannot starve others
CONNECT_TIMEOUT_MS = 3000  # no connection by then: say that nothing binds the endpoint
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
    monitor: zmq.Socket  # the SUB's connect and disconnect events
    replay: ReplayClient | None
    since: float  # when the SUB began connecting (monotonic)
    last_seq: int | None = None  # highest seq received (applied or refused)
    last_digest: int | None = None  # of that batch's payload
    first_digest: int | None = None  # of seq 0's payload: a live 0 that matches it is no restart
    connected: bool = False
    ever_connected: bool = False
    history_due: bool = False
    told_unbound: bool = False


class KvEventWatcher:
    """Watches `endpoints` (one SUB each, all topics); `replay[i]` is endpoint i's replay
    ROUTER or None. Raises KvEventError for a bad address, dialect, replay list or timeout."""

    def __init__(self, endpoints: list[str], replay: list[str | None] | None = None, dialect: str = "auto",
                 state: KvEventState | None = None, *, replay_timeout_ms: int = REPLAY_TIMEOUT_MS,
                 connect_timeout_ms: int = CONNECT_TIMEOUT_MS, context: zmq.Context | None = None):
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
        if replay_timeout_ms <= 0 or connect_timeout_ms <= 0:
            raise KvEventError(f"replay timeout {replay_timeout_ms} ms and connect timeout {connect_timeout_ms} ms "
                               "must be more than 0")
        self.state = state if state is not None else KvEventState()
        self.replay_timeout_ms = replay_timeout_ms
        self.connect_timeout_ms = connect_timeout_ms
        self._own_context = context is None
        self._ctx = context or zmq.Context()
        self._poller = zmq.Poller()
        self._streams: list[_Stream] = []
        for endpoint, replay_endpoint in zip(endpoints, replay):
            sub = self._socket(zmq.SUB)
            sub.setsockopt(zmq.RCVHWM, RCVHWM)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            monitor = sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)  # before connect()
            sub.connect(endpoint)
            self._poller.register(sub, zmq.POLLIN)
            self._poller.register(monitor, zmq.POLLIN)
            client = None if replay_endpoint is None else ReplayClient(replay_endpoint, self._socket,
                                                                       replay_timeout_ms, self.dialect)
            self._streams.append(_Stream(endpoint, sub, monitor, client, time.monotonic()))

    @property
    def endpoints(self) -> list[str]:
        return [s.endpoint for s in self._streams]

    def _socket(self, kind: int) -> zmq.Socket:
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME)
        return sock

    def poll(self, timeout_ms: int) -> int:
        """Wait up to timeout_ms for messages, fetch the history of a stream that (re)connected,
        then take every live message waiting (MAX_DRAIN per socket). Undecodable frames and
        silent endpoints are counted and noted in the state, never raised. Returns how many
        live messages were taken."""
        ready = dict(self._poller.poll(timeout_ms))
        for stream in self._streams:
            if stream.monitor in ready:
                self._read_monitor(stream)
            self._check_connection(stream)
            if stream.history_due:  # before the live messages, which may continue it
                self._fetch_history(stream)
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

    def _read_monitor(self, stream: _Stream) -> None:
        for _ in range(MAX_DRAIN):
            try:
                event = recv_monitor_message(stream.monitor, zmq.NOBLOCK)["event"]
            except zmq.Again:
                return
            if event == zmq.EVENT_CONNECTED:
                stream.connected = stream.ever_connected = True
                stream.history_due = stream.replay is not None
            elif event == zmq.EVENT_DISCONNECTED:
                stream.connected = False

    def _check_connection(self, stream: _Stream) -> None:
        """Note, once, a live endpoint nothing accepts connections on (a SUB waits there in silence)."""
        if stream.ever_connected or stream.told_unbound:
            return
        waited = time.monotonic() - stream.since
        if waited * 1000 < self.connect_timeout_ms:
            return
        stream.told_unbound = True
        self.state.record_notice(
            f"nothing accepts connections at {stream.endpoint} after {waited:.1f} s: is the engine's KV-event "
            "endpoint bound there? (vLLM binds only for tcp://*:P, tcp://[::]:P or ipc://PATH; given "
            "tcp://HOST:P it connects instead)")
        if stream.replay is not None and stream.last_seq is None:
            stream.history_due = True  # the replay endpoint may still be there, and say what is cached

    def _fetch_history(self, stream: _Stream) -> None:
        """Everything the engine still buffers after what this stream holds (from 0 when it
        holds nothing). When the engine no longer has the last batch applied, it restarted."""
        stream.history_due = False
        known = stream.last_seq
        result = stream.replay.fetch(0 if known is None else known)
        if known is not None and result.complete and not result.has(known, stream.last_digest):
            self.state.record_restart(stream.endpoint)
            stream.last_seq = stream.last_digest = stream.first_digest = None
            result = stream.replay.fetch(0)
        self._take_replayed(stream, result)
        self.state.record_history(len(result.answers), result.complete)

    def _receive(self, stream: _Stream, frames: list[bytes]) -> None:
        try:
            batch, error = decode_frames(frames, self.dialect), None
        except KvEventError as exc:
            batch, error = None, exc
        seq = batch.seq if batch is not None else error.seq
        if seq is None:  # not even a readable seq: refused, and the stream position is unknown
            self.state.record_refusal(stream.endpoint, str(error))
            return
        digest = hash(bytes(frames[2]))  # a readable seq means three frames
        if stream.last_seq is not None:
            if seq == 0 and digest != stream.first_digest:  # a new batch 0: the engine restarted
                self.state.record_restart(stream.endpoint)
                stream.last_seq = None
            elif seq <= stream.last_seq:
                self.state.record_duplicate()
                return
            elif seq > stream.last_seq + 1:
                expected = stream.last_seq + 1
                filled = stream.replay is not None and self._replay_gap(stream, expected, seq)
                self.state.record_gap(stream.endpoint, expected, seq, filled)
                if seq <= stream.last_seq:  # the replay brought this batch already
                    self.state.record_duplicate()
                    return
        self._take(stream, ReplayAnswer(seq, batch, error, digest), replayed=False)

    def _take(self, stream: _Stream, answer: ReplayAnswer, replayed: bool) -> None:
        if answer.error is None:
            self.state.apply(answer.batch, stream.endpoint)
        elif replayed:
            self.state.record_replay_refusal(stream.endpoint, f"seq {answer.seq}: {answer.error}", answer.seq)
        else:
            self.state.record_refusal(stream.endpoint, f"seq {answer.seq}: {answer.error}", answer.seq)
        stream.last_seq, stream.last_digest = answer.seq, answer.digest
        if answer.seq == 0:
            stream.first_digest = answer.digest

    def _take_replayed(self, stream: _Stream, result) -> None:
        """Apply, in seq order, the replayed batches newer than what the stream holds."""
        for message in result.refusals:
            self.state.record_replay_refusal(stream.endpoint, message)
        if result.problem is not None:
            self.state.record_notice(result.problem)
        for answer in result.answers:
            if stream.last_seq is None or answer.seq > stream.last_seq:
                self._take(stream, answer, replayed=True)

    def _replay_gap(self, stream: _Stream, start: int, got: int) -> bool:
        """Ask for every batch from `start`, apply the new ones, and say whether start..got-1 all came."""
        result = stream.replay.fetch(start)
        due = start
        for answer in result.answers:
            if answer.seq == due:
                due += 1
        self._take_replayed(stream, result)
        self.state.record_replay(len(result.answers), result.complete)
        return due >= got

    def close(self) -> None:
        for stream in self._streams:
            stream.sub.disable_monitor()
            stream.monitor.close(linger=0)
            stream.sub.close(linger=0)
            if stream.replay is not None:
                stream.replay.close()
        if self._own_context:
            self._ctx.term()

    def __enter__(self) -> KvEventWatcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
