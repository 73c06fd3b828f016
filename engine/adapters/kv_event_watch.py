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
- A seq more than MAX_SEQ_JUMP from the last one is another counter, not a gap: a publisher
  restart (or a lie). With a replay endpoint the watcher resynchronises from it, and a batch
  the engine's own replay does not hold is refused; without one it follows the new numbers.
  Either way no later batch is dropped as a "duplicate" of a number it never saw.
- Bounds: a frame over MAX_FRAME_BYTES is dropped by libzmq with its connection (counted as a
  disconnect) before it is buffered; libzmq holds at most RCVHWM live messages unread per
  endpoint (the engine's PUB queues the rest); the decoder bounds what one payload builds
  (kv_event_decode.py), the state the blocks held (kv_event_state.py), and the replay
  client what one replay takes (kv_event_replay.py), applying each answer as it comes.

The watcher connects to any tcp:// or ipc:// address the user names (this is a client of
someone else's engine; PageWarden's loopback-only rule is for its own endpoints).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import zmq
from zmq.utils.monitor import recv_monitor_message

from engine.adapters.kv_event_decode import MAX_PAYLOAD_BYTES, KvEventError, check_dialect, decode_frames
from engine.adapters.kv_event_replay import MAX_REPLAY_BYTES, ReplayAnswer, ReplayClient, ReplayResult
from engine.adapters.kv_event_state import BlockLimitError, KvEventState
from engine.wire.sockets import drain

REPLAY_TIMEOUT_MS = 2000
MAX_DRAIN = 10_000  # messages taken from one socket per poll, so one stream cannot starve others
CONNECT_TIMEOUT_MS = 3000  # no connection by then: say that nothing binds the endpoint
# Live messages libzmq holds unread per endpoint (~66 MiB of frames at most): a slow watcher
# loses nothing by it, the engine's PUB queues the rest (vLLM: up to 100,000 messages).
RCVHWM = 32
# 64 KiB over the decoder's limit, so a payload a little over it still reaches the decoder,
# which names its size; libzmq drops a larger frame with its connection, before buffering it.
MAX_FRAME_BYTES = MAX_PAYLOAD_BYTES + 64 * 1024
# A seq further than this from the last one is not a gap (vLLM's replay buffer holds 10,000
# batches; a busy engine publishes ~300 a second) but another counter: a restart, or a lie.
MAX_SEQ_JUMP = 1 << 20
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
                 connect_timeout_ms: int = CONNECT_TIMEOUT_MS, replay_max_bytes: int = MAX_REPLAY_BYTES,
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
                                                                       replay_timeout_ms, self.dialect,
                                                                       replay_max_bytes)
            self._streams.append(_Stream(endpoint, sub, monitor, client, time.monotonic()))

    @property
    def endpoints(self) -> list[str]:
        return [s.endpoint for s in self._streams]

    def _socket(self, kind: int) -> zmq.Socket:
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
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
                self.state.record_disconnect(
                    stream.endpoint, f"the connection to {stream.endpoint} dropped: the engine went away, or it sent "
                    f"a frame over {MAX_FRAME_BYTES:,} bytes (the watcher's limit; libzmq drops the connection "
                    "with it)")
                # libzmq never reconnects after a protocol error (such a frame is one): start a
                # new connection whatever the cause (after any other, libzmq's own would come)
                try:
                    stream.sub.disconnect(stream.endpoint)
                except zmq.ZMQError:
                    pass  # the connection is gone from the socket already
                stream.sub.connect(stream.endpoint)

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

    def _fetch_history(self, stream: _Stream) -> ReplayResult:
        """Everything the engine still buffers after what this stream holds (from 0 when it
        holds nothing), applied as it comes. When the engine's first answer is not the last
        batch applied, the engine no longer has it: it restarted."""
        stream.history_due = False
        known, digest = stream.last_seq, stream.last_digest
        if known is None:
            result = stream.replay.fetch(0, lambda answer: self._take_replayed(stream, answer))
        else:
            ours: list[bool] = []  # the verdict on the first answer with a seq

            def take(answer: ReplayAnswer) -> bool:
                if answer.seq is not None and not ours:
                    ours.append(answer.seq == known and answer.digest == digest)
                    return ours[0]  # ours: go on after it; not ours: stop, the engine restarted
                return self._take_replayed(stream, answer)

            result = stream.replay.fetch(known, take)
            if (ours and not ours[0]) or (result.complete and not ours):
                self.state.record_restart(stream.endpoint)
                self._forget(stream)
                result = stream.replay.fetch(0, lambda answer: self._take_replayed(stream, answer))
        if result.problem is not None:
            self.state.record_notice(result.problem)
        self.state.record_history(result.answers, result.complete)
        return result

    def _receive(self, stream: _Stream, frames: list[bytes]) -> None:
        try:
            batch, error = decode_frames(frames, self.dialect), None
        except KvEventError as exc:
            batch, error = None, exc
        seq = batch.seq if batch is not None else error.seq
        if seq is None:  # not even a readable seq: refused, and the stream position is unknown
            self.state.record_refusal(stream.endpoint, str(error))
            return
        answer = ReplayAnswer(seq, batch, error, hash(bytes(frames[2])))  # a readable seq means three frames
        last = stream.last_seq
        if last is None:
            pass
        elif seq == 0 and answer.digest != stream.first_digest:  # a new batch 0: the engine restarted
            self.state.record_restart(stream.endpoint)
            self._forget(stream)
        elif abs(seq - last) > MAX_SEQ_JUMP or (seq <= last and stream.replay is None):
            if not self._jumped(stream, answer):
                return
        elif seq <= last:
            self.state.record_duplicate()  # a replay brought it first
            return
        elif seq > last + 1 and not self._gap(stream, seq):
            return
        self._take(stream, answer, replayed=False)

    def _gap(self, stream: _Stream, seq: int) -> bool:
        """Seq `seq` came when last_seq + 1 was due: replay what is missing. Whether to take
        it: not when the replay brought it, nor when a complete replay from the engine's own
        buffer lacks it (the engine buffers each batch before it sends it)."""
        expected = stream.last_seq + 1
        if stream.replay is None:
            self.state.record_gap(stream.endpoint, expected, seq, False)
            return True
        result, filled = self._replay_gap(stream, expected, seq)
        self.state.record_gap(stream.endpoint, expected, seq, filled)
        if stream.last_seq is not None and seq <= stream.last_seq:
            self.state.record_duplicate()
            return False
        if result.complete:
            self.state.record_refusal(stream.endpoint, f"seq {seq:,}: the engine's replay from seq {expected:,} does "
                                      "not hold it, so it is not that engine's batch; refused")
            return False
        return True

    def _jumped(self, stream: _Stream, answer: ReplayAnswer) -> bool:
        """Seq answer.seq is more than MAX_SEQ_JUMP from the last one (or, without a replay,
        behind it: nothing is sent twice then): another counter. Follow it without a replay;
        with one, resynchronise from it and judge the batch again. Whether to take it."""
        last, seq = stream.last_seq, answer.seq
        how = f"more than {MAX_SEQ_JUMP:,}" if abs(seq - last) > MAX_SEQ_JUMP else "backwards, with nothing sent twice"
        if stream.replay is None:
            self.state.record_seq_jump(stream.endpoint, last, seq, how, "without a replay endpoint to check it "
                                       "against, its numbers are followed from here and the blocks held are kept")
            self._forget(stream)
            return True
        result = self._fetch_history(stream)
        now = stream.last_seq
        if now is None or 0 < seq - now <= MAX_SEQ_JUMP:
            take = now is None or seq == now + 1 or self._gap(stream, seq)
            outcome = "resynchronised from its replay" + ("" if take else "; the batch was not taken")
        elif not result.complete:  # nothing to judge it by: follow it rather than drop what comes
            take, outcome = True, "its replay did not answer in full, so its numbers are followed from here"
            self._forget(stream)
        elif seq <= now:
            take, outcome = False, f"resynchronised from its replay, at seq {now:,} already: the batch was not taken"
        else:
            self.state.record_refusal(stream.endpoint, f"seq {seq:,}: the engine's replay ends before it, at seq "
                                      f"{now:,}; refused")
            take = False
            outcome = f"resynchronised from its replay (through seq {now:,}), which does not hold it: refused"
        self.state.record_seq_jump(stream.endpoint, last, seq, how, outcome)
        return take

    def _forget(self, stream: _Stream) -> None:
        stream.last_seq = stream.last_digest = stream.first_digest = None

    def _take(self, stream: _Stream, answer: ReplayAnswer, replayed: bool) -> None:
        error = answer.error
        if error is None:
            try:
                self.state.apply(answer.batch, stream.endpoint)
            except BlockLimitError as exc:
                error = exc
        if error is not None:
            record = self.state.record_replay_refusal if replayed else self.state.record_refusal
            record(stream.endpoint, f"seq {answer.seq}: {error}", answer.seq)
        stream.last_seq, stream.last_digest = answer.seq, answer.digest
        if answer.seq == 0:
            stream.first_digest = answer.digest

    def _take_replayed(self, stream: _Stream, answer: ReplayAnswer) -> bool:
        """Apply a replayed batch newer than what the stream holds (the replay goes on)."""
        last = stream.last_seq
        if answer.seq is None:
            self.state.record_replay_refusal(stream.endpoint, str(answer.error))
        elif last is not None and answer.seq - last > MAX_SEQ_JUMP:
            self.state.record_replay_refusal(stream.endpoint, f"seq {answer.seq:,}: more than {MAX_SEQ_JUMP:,} past "
                                             f"seq {last:,}, the last one held; refused")
        elif last is None or answer.seq > last:
            self._take(stream, answer, replayed=True)
        return True

    def _replay_gap(self, stream: _Stream, start: int, got: int) -> tuple[ReplayResult, bool]:
        """Ask for every batch from `start`, apply the new ones as they come; the result and
        whether start..got-1 all came."""
        due = [start]

        def take(answer: ReplayAnswer) -> bool:
            if answer.seq == due[0]:
                due[0] += 1
            return self._take_replayed(stream, answer)

        result = stream.replay.fetch(start, take)
        if result.problem is not None:
            self.state.record_notice(result.problem)
        self.state.record_replay(result.answers, result.complete)
        return result, due[0] >= got

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
