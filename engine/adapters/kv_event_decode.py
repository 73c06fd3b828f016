"""Decode the KV-cache event frames vLLM and SGLang publish (`--kv-events-config`, publisher
"zmq") into one normalized form: a Batch of BlockStored / BlockRemoved / AllBlocksCleared.

Wire facts, learned from the engines' public sources (no code taken from them):
- A PUB message is 3 frames (topic, seq, payload); topic defaults to ""; seq counts from 0
  and is written `seq.to_bytes(8, "big")` (unsigned). A replay answer is the same 3 frames
  in vLLM since PR #45177 (v0.26), 2 (seq, payload) in SGLang and older vLLM: see
  kv_event_replay.py. vllm-project/vllm
  vllm/distributed/kv_events.py (ZmqEventPublisher._publisher_thread); sgl-project/sglang
  python/sglang/srt/disaggregation/kv_events.py (the same publisher).
- The payload is msgspec's msgpack of an EventBatch (ts, events, rank):
  * vLLM, early (vllm/distributed/kv_events.py @b4e69e0): array_like structs, the batch is
    [ts, events] with no rank; tagged events ["BlockStored", block_hashes, parent_block_hash,
    token_ids, block_size, lora_id], ["BlockRemoved", block_hashes], ["AllBlocksCleared"].
  * vLLM, later (examples/online_serving/kv_events_subscriber.py @0ef0f42): `medium` appended
    to BlockStored and BlockRemoved; vllm-project/vllm PR #18925 added data_parallel_rank.
  * vLLM, current (vllm/distributed/kv_events.py @0181ea3): array_like dropped, so the batch
    is a map {ts, events, data_parallel_rank} and each event a map tagged under "type";
    BlockStored gained lora_name, extra_keys, group_idx, kv_cache_spec_kind,
    kv_cache_spec_sliding_window; BlockRemoved gained group_idx (omitted when default).
  * vLLM hashes are ExternalBlockHash = bytes | int (vllm/v1/core/kv_cache_utils.py): sha256
    bytes by default, or with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES the digest's low 64 bits as
    an UNSIGNED int (`int.from_bytes(...) & (2**64 - 1)`), which msgpack sends as uint64.
  * SGLang (python/sglang/srt/disaggregation/kv_events.py @612d579): array_like, the batch is
    [ts, events, attn_dp_rank], hashes list[int], no medium. A later copy of that file
    (amdpilot-org/sglang @a029c21) adds an optional trailing medium ("GPU", "CPU_PINNED",
    "DISK", "EXTERNAL") and, on salted blocks, a trailing {cache_salt} metadata map.
Where the brief said otherwise: int hashes are unsigned 64-bit in vLLM (not only int64), so
both signed and unsigned 64-bit values are accepted and normalized alike; the current vLLM
batch itself is a map, not only its events; the rank field is data_parallel_rank (vLLM) or
attn_dp_rank (SGLang); early vLLM batches carry no rank at all.

Dialects: "auto" accepts every variant above; "vllm" reads only data_parallel_rank from a
map batch; "sglang" reads only attn_dp_rank and refuses bytes hashes (SGLang sends ints).
Never unpickles. Every refusal is a KvEventError naming the position, the value and what was
expected.

What one payload may cost is bounded before and while it is decoded, never after: its bytes
(MAX_PAYLOAD_BYTES), every array, map and string msgpack reads (the MAX_*_ITEMS and
MAX_STRING_BYTES limits, checked on each header before anything is allocated), and all it
builds together (MAX_DECODED_ITEMS, counted as each array and map closes, innermost first),
so a 2 MiB payload builds at most ~75 MB of Python objects whatever its shape. The block
hashes of one batch (MAX_BATCH_HASHES) are counted before one is turned into text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import msgpack

# vLLM's default step (8,192 tokens) publishes ~60 KB; 2 MiB holds a step of ~400,000 new
# tokens with their ids (5 bytes each at most).
MAX_PAYLOAD_BYTES = 2 * 1024 * 1024
MAX_ARRAY_ITEMS = 1 << 19  # one array: the token ids of a 512K-token prompt stored in one step
MAX_MAP_ITEMS = 256  # one map: a batch or event map has about a dozen fields
MAX_STRING_BYTES = 4096  # one str, bin or ext: the longest sent are LoRA names, salts, multimodal hashes
# Elements of every array and map in one payload: what decoding builds, ~72 bytes each at worst
# (a nested empty map), so ~75 MB; a 2 MiB payload of token ids holds at most ~700,000.
MAX_DECODED_ITEMS = 1 << 20
MAX_EVENTS = 1 << 17  # vLLM sends one BlockRemoved per evicted block, one BlockStored per request
MAX_BATCH_HASHES = 1 << 16  # block hashes stored or removed in one batch: a 1M-token step, 16 a block
MAX_HASH_BYTES = 64
MAX_BLOCK_SIZE = 1 << 20
DIALECTS = ("auto", "vllm", "sglang")
TAGS = ("BlockStored", "BlockRemoved", "AllBlocksCleared")
RANK_FIELDS = {"auto": ("data_parallel_rank", "attn_dp_rank"), "vllm": ("data_parallel_rank",),
               "sglang": ("attn_dp_rank",)}
# Positional field order after the tag; the first `required` must be present, later ones
# are optional, anything beyond is a newer version's field and ignored.
FIELDS = {"BlockStored": (("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                           "medium"), 5),
          "BlockRemoved": (("block_hashes", "medium"), 1),
          "AllBlocksCleared": ((), 0)}
MAP_REQUIRED = {"BlockStored": ("block_hashes", "token_ids", "block_size"), "BlockRemoved": ("block_hashes",),
                "AllBlocksCleared": ()}
END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)
_U64 = (1 << 64) - 1
_OVER_LIMIT = re.compile(r"(\d+) exceeds max_(array|map|str|bin|ext)_len\((\d+)\)")  # msgpack's words


class KvEventError(ValueError):
    """A frame or payload that is not a KV event batch; `seq` is its sequence number when
    the seq frame itself was readable (so a watcher can still count it as received)."""

    def __init__(self, message: str, seq: int | None = None):
        super().__init__(message)
        self.seq = seq


@dataclass(frozen=True)
class BlockStored:
    block_hashes: list[str]
    parent: str | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: list[str]
    medium: str | None


@dataclass(frozen=True)
class AllBlocksCleared:
    pass


@dataclass
class Batch:
    seq: int
    ts: float
    dp_rank: int | None
    events: list = field(default_factory=list)
    topic: bytes = b""


def _show(value, limit: int = 60) -> str:
    """A short repr for an error message; never raises (a hostile value nests thousands deep)."""
    try:
        text = repr(value)
    except RecursionError:
        text = f"<{type(value).__name__} nested too deeply to show>"
    return text if len(text) <= limit else text[:limit] + "…"


def _kind(value) -> str:
    return "nil" if value is None else type(value).__name__


def check_dialect(dialect: str) -> str:
    """`dialect` itself; KvEventError naming it and the known ones otherwise."""
    if dialect not in DIALECTS:
        raise KvEventError(f"unknown dialect {dialect!r}; known: {', '.join(DIALECTS)}")
    return dialect


def read_seq(frame: bytes, where: str) -> int:
    """The 8-byte big-endian unsigned sequence number in `frame`."""
    if len(frame) != 8:
        raise KvEventError(f"{where}: sequence number must be 8 bytes big-endian, got {len(frame)} bytes "
                           f"({_show(bytes(frame[:16]))})")
    return int.from_bytes(frame, "big")


def normalize_hash(value, where: str, dialect: str = "auto") -> str:
    """A block hash as stable hex: an int (signed or unsigned 64-bit) as the 16 hex digits of
    its unsigned 64-bit value, bytes (1..64) as their hex."""
    if isinstance(value, int) and not isinstance(value, bool):
        if not -(1 << 63) <= value <= _U64:
            raise KvEventError(f"{where}: hash {value} does not fit 64 bits (signed or unsigned)")
        return f"{value & _U64:016x}"
    if isinstance(value, bytes):
        if dialect == "sglang":
            raise KvEventError(f"{where}: hash {_show(value)} is bytes, but the sglang dialect sends integer "
                               "hashes; use --dialect auto or vllm")
        if not 1 <= len(value) <= MAX_HASH_BYTES:
            raise KvEventError(f"{where}: hash of {len(value)} bytes; expected 1 to {MAX_HASH_BYTES}")
        return value.hex()
    raise KvEventError(f"{where}: hash {_show(value)} is {_kind(value)}; expected int or bytes")


def _int(value, where: str, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise KvEventError(f"{where}: {_show(value)} is {_kind(value)}; expected an integer")
    if not low <= value <= high:
        raise KvEventError(f"{where}: {value} is outside {low}..{high}")
    return value


def _optional_int(value, where: str) -> int | None:
    return None if value is None else _int(value, where, -(1 << 63), _U64)


def _hashes(value, where: str, dialect: str) -> list[str]:
    if not isinstance(value, list):
        raise KvEventError(f"{where}: block_hashes {_show(value)} is {_kind(value)}; expected an array")
    return [normalize_hash(h, f"{where}: block_hashes[{i}]", dialect) for i, h in enumerate(value)]


def _medium(value, where: str) -> str | None:
    if value is None or (isinstance(value, str) and 0 < len(value) <= 64):
        return value
    raise KvEventError(f"{where}: medium {_show(value)} is {_kind(value)}; expected a name of 1 to 64 "
                       "characters or nil")


def _event_fields(raw, where: str) -> tuple[str, dict]:
    """(tag, {field: value}) from a tagged array or a tagged map."""
    if isinstance(raw, list):
        if not raw:
            raise KvEventError(f"{where}: empty array; expected a tag ({', '.join(TAGS)}) first")
        tag = raw[0]
    elif isinstance(raw, dict):
        if "type" not in raw:
            raise KvEventError(f"{where}: map without a 'type' tag; keys: {sorted(map(str, raw))[:8]}")
        tag = raw["type"]
    else:
        raise KvEventError(f"{where}: {_show(raw)} is {_kind(raw)}; expected a tagged array or map")
    if tag not in TAGS:
        raise KvEventError(f"{where}: unknown tag {_show(tag)}; known: {', '.join(TAGS)}")
    names, required = FIELDS[tag]
    if isinstance(raw, dict):
        missing = [name for name in MAP_REQUIRED[tag] if name not in raw]
        if missing:
            raise KvEventError(f"{where}: {tag} map lacks {', '.join(missing)}; keys: {sorted(map(str, raw))}")
        return tag, {name: raw.get(name) for name in names}
    values = raw[1:]
    if len(values) < required:
        raise KvEventError(f"{where}: {tag} needs at least {required} fields ({', '.join(names[:required])}), "
                           f"got {len(values)}")
    return tag, dict(zip(names, values))


def decode_event(raw, index: int, dialect: str = "auto"):
    """One event (tagged array or map) as BlockStored, BlockRemoved or AllBlocksCleared."""
    where = f"event {index}"
    tag, values = _event_fields(raw, where)
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    hashes = _hashes(values["block_hashes"], where, dialect)
    medium = _medium(values.get("medium"), where)
    if tag == "BlockRemoved":
        return BlockRemoved(hashes, medium)
    parent = values["parent_block_hash"]
    tokens = values["token_ids"]
    if not isinstance(tokens, list):
        raise KvEventError(f"{where}: token_ids {_show(tokens)} is {_kind(tokens)}; expected an array")
    bad = next((i for i, t in enumerate(tokens) if type(t) is not int), None)
    if bad is not None:
        raise KvEventError(f"{where}: token_ids[{bad}] {_show(tokens[bad])} is {_kind(tokens[bad])}; "
                           "expected an integer")
    return BlockStored(
        block_hashes=hashes,
        parent=None if parent is None else normalize_hash(parent, f"{where}: parent_block_hash", dialect),
        token_ids=tokens,
        block_size=_int(values["block_size"], f"{where}: block_size", 1, MAX_BLOCK_SIZE),
        lora_id=_optional_int(values.get("lora_id"), f"{where}: lora_id"),
        medium=medium,
    )


class _ItemBudget:
    """msgpack hooks counting the elements of each array and map as it closes (innermost
    first), stopping the decode once MAX_DECODED_ITEMS are built."""

    def __init__(self):
        self.items = 0

    def _count(self, container):
        self.items += len(container) + 1
        if self.items > MAX_DECODED_ITEMS:
            raise KvEventError(f"payload decodes to more than {MAX_DECODED_ITEMS:,} array and map elements; "
                               f"the limit is {MAX_DECODED_ITEMS:,}")
        return container

    list_hook = object_hook = _count


def unpack_bounded(payload: bytes, where: str, seq: int | None = None):
    """msgpack `payload` decoded within the limits above; KvEventError (with `seq`) otherwise."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise KvEventError(f"{where}: payload is {len(payload):,} bytes; the limit is {MAX_PAYLOAD_BYTES:,}", seq)
    budget = _ItemBudget()
    # each element takes a byte at least: no header may claim more than the payload holds
    # (msgpack allocates an array's slots when it reads the header)
    try:
        return msgpack.unpackb(payload, raw=False, strict_map_key=True, list_hook=budget.list_hook,
                               object_hook=budget.object_hook, max_array_len=min(MAX_ARRAY_ITEMS, len(payload)),
                               max_map_len=min(MAX_MAP_ITEMS, len(payload) // 2), max_str_len=MAX_STRING_BYTES,
                               max_bin_len=MAX_STRING_BYTES, max_ext_len=MAX_STRING_BYTES)
    except KvEventError as exc:
        raise KvEventError(f"{where}: {exc}", seq) from None
    except ValueError as exc:
        over = _OVER_LIMIT.fullmatch(str(exc))
        if over is None:
            raise KvEventError(f"{where}: payload is not msgpack ({type(exc).__name__}: {exc})", seq) from None
        size, kind, limit = int(over[1]), over[2], int(over[3])
        raise KvEventError(f"{where}: a msgpack {kind} of {size:,} {'items' if kind in ('array', 'map') else 'bytes'}; "
                           f"the limit is {limit:,}", seq) from None
    except Exception as exc:  # msgpack raises UnpackException, UnicodeDecodeError, ...
        raise KvEventError(f"{where}: payload is not msgpack ({type(exc).__name__}: {exc})", seq) from None


def _raw_hash_count(raw) -> int:
    """How many block hashes an undecoded event carries (0 when it is malformed: decode_event
    says why)."""
    if isinstance(raw, list):
        hashes = raw[1] if len(raw) > 1 and raw[0] in ("BlockStored", "BlockRemoved") else None
    elif isinstance(raw, dict):
        hashes = raw.get("block_hashes")
    else:
        hashes = None
    return len(hashes) if isinstance(hashes, list) else 0


def _batch_parts(obj, dialect: str) -> tuple:
    """(ts, events, rank) from an array batch [ts, events(, rank)] or a map batch."""
    if isinstance(obj, list):
        if len(obj) < 2:
            raise KvEventError(f"batch: array of at least 2 fields (ts, events[, rank]) expected, got {len(obj)}")
        return obj[0], obj[1], obj[2] if len(obj) > 2 else None
    if isinstance(obj, dict):
        missing = [key for key in ("ts", "events") if key not in obj]
        if missing:
            raise KvEventError(f"batch: map lacks {', '.join(missing)}; keys: {sorted(map(str, obj))[:8]}")
        rank = next((obj[name] for name in RANK_FIELDS[dialect] if name in obj), None)
        return obj["ts"], obj["events"], rank
    raise KvEventError(f"batch: {_show(obj)} is {_kind(obj)}; expected an array or map (ts, events, rank)")


def decode_payload(payload: bytes, seq: int, dialect: str = "auto", where: str = "frame 2",
                   topic: bytes = b"") -> Batch:
    """The msgpack `payload` of batch `seq` as a Batch. Raises KvEventError (with .seq)."""
    check_dialect(dialect)
    obj = unpack_bounded(payload, where, seq)
    try:
        ts, events, rank = _batch_parts(obj, dialect)
        if not isinstance(ts, (int, float)) or isinstance(ts, bool):
            raise KvEventError(f"batch: ts {_show(ts)} is {_kind(ts)}; expected a number")
        if not isinstance(events, list):
            raise KvEventError(f"batch: events {_show(events)} is {_kind(events)}; expected an array")
        if len(events) > MAX_EVENTS:
            raise KvEventError(f"batch: {len(events):,} events; the limit is {MAX_EVENTS:,}")
        hashes = sum(_raw_hash_count(raw) for raw in events)
        if hashes > MAX_BATCH_HASHES:
            raise KvEventError(f"batch: {hashes:,} block hashes in one batch; the limit is {MAX_BATCH_HASHES:,}")
        rank = None if rank is None else _int(rank, "batch: rank", 0, (1 << 31) - 1)
        decoded = [decode_event(raw, i, dialect) for i, raw in enumerate(events)]
    except KvEventError as exc:
        raise KvEventError(str(exc), seq) from None
    return Batch(seq=seq, ts=float(ts), dp_rank=rank, events=decoded, topic=topic)


def decode_frames(frames, dialect: str = "auto") -> Batch:
    """A PUB message (topic, seq, payload) as a Batch. Raises KvEventError naming the frame,
    the bad value and what was expected."""
    check_dialect(dialect)
    if len(frames) != 3:
        raise KvEventError(f"3 frames expected (topic, seq, payload), got {len(frames)}")
    topic, seq_frame, payload = (bytes(f) for f in frames)
    return decode_payload(payload, read_seq(seq_frame, "frame 1"), dialect, "frame 2", topic)


def decode_replay_frames(frames, dialect: str = "auto") -> Batch | None:
    """A replay answer (after the ROUTER's delimiter) as a Batch, or None for the end marker
    (seq -1 and an empty payload). Both engine forms, told apart by the frame count: 3 is
    vLLM's since PR #45177 (topic, seq, payload; end b"", END, b""), 2 is SGLang's and older
    vLLM's (seq, payload; end END, b""). Raises KvEventError like decode_frames."""
    if len(frames) == 3:
        topic, seq_frame, payload = (bytes(f) for f in frames)
        first = 1
    elif len(frames) == 2:
        topic, (seq_frame, payload), first = b"", (bytes(f) for f in frames), 0
    else:
        raise KvEventError(f"replay: 3 frames (topic, seq, payload) or 2 (seq, payload) expected, got {len(frames)}")
    if seq_frame == END_OF_REPLAY:
        if payload:
            raise KvEventError(f"replay: end marker with a {len(payload)}-byte payload; expected an empty one")
        return None
    return decode_payload(payload, read_seq(seq_frame, f"replay frame {first}"), dialect,
                          f"replay frame {first + 1}", topic)
