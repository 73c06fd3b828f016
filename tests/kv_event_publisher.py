"""A KV-event publisher for tests, built from the public description of the vLLM / SGLang wire
format (see engine/adapters/kv_event_decode.py), not from their code.

It binds an XPUB (a PUB that also reports subscriptions, so a test can wait for the
subscriber instead of sleeping past the slow-joiner window) and, optionally, a replay ROUTER
served by a thread from a buffer of every batch published. The replay answers in either
form the engines use (`replay_form`): "vllm" (the default, vLLM 0.26+ and 0.32: each answer
(topic, seq, payload), the end marker (b"", END, b"")) or "sglang" (SGLang and older vLLM:
(seq, payload), then (END, b"")). It can write each wire variant,
lose a batch in transit (buffered for replay, never sent: a gap), skip sequence numbers
outright, and send garbage.

Events are written neutrally as maps, e.g. stored([1, 2], None, range(32)); `encode()`
turns a batch of them into one variant's msgpack payload.
"""

from __future__ import annotations

import threading

import msgpack
import zmq

END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)
VARIANTS = ("vllm-array", "vllm-bytes", "vllm-map", "vllm-extra", "vllm-old", "sglang", "sglang-salted")
REPLAY_FORMS = ("vllm", "sglang")
GARBAGE = ("not-msgpack", "frame-count", "unknown-tag", "short-seq")


def stored(hashes, parent, tokens, block_size: int = 16, lora_id=None, medium="GPU") -> dict:
    return {"type": "BlockStored", "block_hashes": list(hashes), "parent_block_hash": parent,
            "token_ids": list(tokens), "block_size": block_size, "lora_id": lora_id, "medium": medium}


def removed(hashes, medium="GPU") -> dict:
    return {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": medium}


def cleared() -> dict:
    return {"type": "AllBlocksCleared"}


def as_bytes(value):
    """An int hash as vLLM's default 32-byte (sha256-sized) bytes hash; others unchanged."""
    return value.to_bytes(32, "big") if isinstance(value, int) else value


def _bytes_hashes(event: dict) -> dict:
    event = dict(event)
    if "block_hashes" in event:
        event["block_hashes"] = [as_bytes(h) for h in event["block_hashes"]]
    if event.get("parent_block_hash") is not None:
        event["parent_block_hash"] = as_bytes(event["parent_block_hash"])
    return event


def _array(event: dict, *, medium: bool, extra: bool = False, salted: bool = False) -> list:
    """A tagged positional array, as msgspec writes an array_like tagged struct."""
    tag = event["type"]
    if tag == "AllBlocksCleared":
        return [tag]
    if tag == "BlockRemoved":
        fields = [event["block_hashes"]] + ([event["medium"]] if medium else [])
        return [tag, *fields, *([0] if extra else [])]  # vLLM's newer group_idx
    fields = [event["block_hashes"], event["parent_block_hash"], event["token_ids"], event["block_size"],
              event["lora_id"]] + ([event["medium"]] if medium else [])
    if extra:  # vLLM's newer lora_name, extra_keys, group_idx, kv_cache_spec_* and one unknown future field
        fields += [None, [None] * len(event["block_hashes"]), 0, "full_attention", None, {"future": True}]
    if salted:
        fields.append({"cache_salt": "tenant-a"})  # SGLang's trailing metadata on salted blocks
    return [tag, *fields]


def _map(event: dict) -> dict:
    """A tagged map, as current vLLM writes events (tag under "type", newer fields present)."""
    if event["type"] == "BlockStored":
        return {**event, "lora_name": None, "extra_keys": [None] * len(event["block_hashes"]), "group_idx": 0,
                "kv_cache_spec_kind": "full_attention"}
    return dict(event)


def encode(events: list[dict], variant: str, rank: int = 0, ts: float = 1.0e9) -> bytes:
    """One batch of neutral events as `variant`'s msgpack payload."""
    if variant == "vllm-array":
        body = [ts, [_array(e, medium=True) for e in events], rank]
    elif variant == "vllm-bytes":
        body = [ts, [_array(_bytes_hashes(e), medium=True) for e in events], rank]
    elif variant == "vllm-map":
        body = {"ts": ts, "events": [_map(_bytes_hashes(e)) for e in events], "data_parallel_rank": rank}
    elif variant == "vllm-extra":
        body = [ts, [_array(e, medium=True, extra=True) for e in events], rank]
    elif variant == "vllm-old":  # before medium and before the batch carried a rank
        body = [ts, [_array(e, medium=False) for e in events]]
    elif variant == "sglang":
        body = [ts, [_array(e, medium=False) for e in events], rank]
    elif variant == "sglang-salted":
        body = [ts, [_array(e, medium=True, salted=e["type"] == "BlockStored") for e in events], rank]
    else:
        raise ValueError(f"unknown variant {variant!r}; known: {', '.join(VARIANTS)}")
    return msgpack.packb(body)


class KvEventTestPublisher:
    """XPUB on `endpoint` and, when given, a replay ROUTER on `replay_endpoint` (port 0 picks a
    free port; .endpoint / .replay_endpoint hold the bound addresses) answering in
    `replay_form`. Use as a context manager."""

    def __init__(self, endpoint: str = "tcp://127.0.0.1:0", replay_endpoint: str | None = "tcp://127.0.0.1:0",
                 topic: bytes = b"kv-events", replay_form: str = "vllm"):
        if replay_form not in REPLAY_FORMS:
            raise ValueError(f"unknown replay form {replay_form!r}; known: {', '.join(REPLAY_FORMS)}")
        self.ctx = zmq.Context()
        self.topic = topic
        self.replay_form = replay_form
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind(endpoint)
        self.endpoint = self.pub.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.next_seq = 0
        self.buffer: list[tuple[int, bytes]] = []
        self.replay_requests: list[int] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.replay_endpoint = self._thread = None
        if replay_endpoint is not None:
            router = self.ctx.socket(zmq.ROUTER)
            router.setsockopt(zmq.LINGER, 0)
            router.bind(replay_endpoint)
            self.replay_endpoint = router.getsockopt(zmq.LAST_ENDPOINT).decode()
            self._thread = threading.Thread(target=self._serve_replay, args=(router,), daemon=True)
            self._thread.start()

    def reopen(self) -> None:
        """Close the XPUB and bind a new one on the same endpoint, keeping the sequence and the
        replay buffer: the engine's connections drop and come back, the engine does not restart."""
        self.pub.close(linger=0)
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind(self.endpoint)

    def wait_for_subscriber(self, timeout_s: float = 60.0) -> bool:
        """True once a subscriber's subscription reached the XPUB (messages sent from then on
        reach it); False after timeout_s."""
        if not self.pub.poll(int(timeout_s * 1000)):
            return False
        return self.pub.recv()[:1] == b"\x01"

    def publish(self, events: list[dict], variant: str = "vllm-array", rank: int = 0, lost: bool = False) -> int:
        """Publish one batch; lost=True buffers it for replay but never sends it. Returns its seq."""
        return self.publish_payload(encode(events, variant, rank), lost=lost)

    def publish_payload(self, payload: bytes, lost: bool = False) -> int:
        with self._lock:
            seq, self.next_seq = self.next_seq, self.next_seq + 1
            self.buffer.append((seq, payload))
        if not lost:
            self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        return seq

    def skip(self, count: int) -> None:
        """Jump the sequence by `count` with nothing buffered: a gap no replay can fill."""
        with self._lock:
            self.next_seq += count

    def send_garbage(self, kind: str) -> None:
        """not-msgpack and unknown-tag take a seq (like a real batch); frame-count and short-seq
        do not."""
        if kind == "not-msgpack":
            self.publish_payload(b"\xc1 this is not msgpack")
        elif kind == "unknown-tag":
            self.publish_payload(msgpack.packb([1.0, [["Foo", [1], None]], 0]))
        elif kind == "frame-count":
            self.pub.send_multipart([self.topic, b"only two frames"])
        elif kind == "short-seq":
            self.pub.send_multipart([self.topic, b"\x00\x01", encode([], "vllm-array")])
        else:
            raise ValueError(f"unknown garbage {kind!r}; known: {', '.join(GARBAGE)}")

    def _serve_replay(self, router: zmq.Socket) -> None:
        try:
            while not self._stop.is_set():
                if not router.poll(50):
                    continue
                frames = router.recv_multipart()
                if len(frames) != 3 or len(frames[2]) != 8:
                    continue  # not a replay request: ignored, as the engines do
                identity, start = frames[0], int.from_bytes(frames[2], "big")
                with self._lock:
                    self.replay_requests.append(start)
                    answers = [(seq, payload) for seq, payload in self.buffer if seq >= start]
                topic, end_topic = ([self.topic], [b""]) if self.replay_form == "vllm" else ([], [])
                for seq, payload in answers:
                    router.send_multipart([identity, b"", *topic, seq.to_bytes(8, "big"), payload])
                router.send_multipart([identity, b"", *end_topic, END_OF_REPLAY, b""])
        finally:
            router.close(linger=0)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.pub.close(linger=0)
        self.ctx.term()

    def __enter__(self) -> KvEventTestPublisher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
