"""The wire protocol: the one source of truth for every message between processes.

A message is a ZeroMQ multipart message: one msgpack header frame (a map carrying `v`,
the schema version, and `op` or `topic`) followed by raw little-endian array frames that
the header describes (`arrays`: [[name, dtype, shape], ...]). Never pickle; msgpack
extension types are refused. Arrays are sent zero-copy and received as read-only views.

Nothing here imports torch: the GUI and the CLI client use this module.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn, TypeAlias

import msgpack
import numpy as np

if TYPE_CHECKING:  # for annotations only: this module never needs zmq at run time
    import zmq

    # A frame as sent (pack) or received: bytes when received with copy=True, a zmq.Frame with copy=False.
    Frame: TypeAlias = bytes | bytearray | memoryview | zmq.Frame

VERSION = 1

# Size limits (ZMQ_MAXMSGSIZE is per frame).
MAX_HEADER_BYTES = 8 << 20  # a header holds at most a long prompt's token ids
MAX_CONTROL_FRAME = 64 << 20  # client <-> supervisor
MAX_BUS_FRAME = 512 << 20  # supervisor <-> workers: page keyframes of big pools
MAX_KV_FRAME = 256 << 20  # one KV page (all layers) of a large model fits easily
MAX_ARRAYS = 64

# Array dtypes allowed on the wire, always little-endian.
DTYPES = {"u1": np.uint8, "i4": np.int32, "i8": np.int64, "f4": np.float32, "f8": np.float64}
_DTYPE_NAMES = {np.dtype(v).newbyteorder("<"): k for k, v in DTYPES.items()}

# Telemetry topics: engine/wire/states.py (Topic, pages_topic).

# The environment variable that hands a worker its bus token (never on a command line).
TOKEN_ENV = "PAGEWARDEN_WORKER_TOKEN"
# A worker silent this long is hung (a dead one is seen at once by its exit): the supervisor
# restarts it, and its marks in the shared core table are stale.
HEARTBEAT_TIMEOUT_S = 30.0

# The tenant (and data tier) of the canary requests the supervisor sends on its own.
CANARY_TENANT = "canary"
CANARY_PREFIX = "canary-"  # their request ids: canary-<slot>; no client may submit one


class ProtocolError(ValueError):
    """A message that does not follow this protocol; names the field and what was expected."""

    code = "bad_message"

    def to_wire(self) -> dict[str, Any]:
        return {"code": self.code, "message": str(self)}


@dataclass
class Message:
    header: dict[str, Any]
    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def op(self) -> str | None:
        return self.header.get("op")

    @property
    def topic(self) -> str | None:
        return self.header.get("topic")

    def get(self, key: str, default: Any = None) -> Any:
        return self.header.get(key, default)


# ---- framing --------------------------------------------------------------------------

def pack(header: dict[str, Any], arrays: dict[str, np.ndarray] | None = None) -> list[bytes | memoryview]:
    """Header + arrays -> frames. Arrays go out as buffers (zero-copy when sent with copy=False)."""
    header = dict(header)
    frames: list[bytes | memoryview] = [b""]
    if arrays:
        specs = []
        for name, arr in arrays.items():
            arr = np.ascontiguousarray(arr)
            if arr.dtype.byteorder == ">":
                arr = arr.astype(arr.dtype.newbyteorder("<"))
            key = _DTYPE_NAMES.get(arr.dtype)
            if key is None:
                raise ProtocolError(f"array {name!r}: dtype {arr.dtype} cannot go on the wire")
            specs.append([name, key, list(arr.shape)])
            # numpy's stubs give ndarray __buffer__ only for Python >= 3.12
            frames.append(memoryview(arr).cast("B") if arr.size else b"")  # type: ignore[arg-type]
        header["arrays"] = specs
    frames[0] = pack_header(header)
    return frames


def pack_header(header: dict[str, Any]) -> bytes:
    """Just the msgpack header frame (callers that append raw frames of their own)."""
    packed: bytes = msgpack.packb({"v": VERSION, **header}, use_bin_type=True)  # msgpack has no type hints
    return packed


def _refuse_ext(code: int, data: bytes) -> NoReturn:
    raise ProtocolError(f"msgpack extension type {code} is not allowed")


def unpack(frames: Sequence[Frame]) -> Message:
    """Frames -> Message. Raises ProtocolError for anything malformed; never executes data."""
    if not frames:
        raise ProtocolError("empty message")
    header = unpack_header(frames[0])
    specs = header.pop("arrays", [])
    if not isinstance(specs, list) or len(specs) > MAX_ARRAYS:
        raise ProtocolError(f"'arrays' must be a list of at most {MAX_ARRAYS} specs")
    if len(frames) != 1 + len(specs):
        raise ProtocolError(f"header describes {len(specs)} array frame(s) but {len(frames) - 1} followed")
    arrays = {}
    for spec, frame in zip(specs, frames[1:]):
        name, arr = _array(spec, frame)
        arrays[name] = arr
    return Message(header, arrays)


def unpack_header(frame: Frame) -> dict[str, Any]:
    """One msgpack header frame -> dict with a checked version and op/topic."""
    raw = frame_bytes(frame)
    if len(raw) > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {len(raw):,} bytes exceeds {MAX_HEADER_BYTES:,}")
    try:
        header = msgpack.unpackb(raw, raw=False, strict_map_key=True, ext_hook=_refuse_ext, use_list=True)
    except ProtocolError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(f"header is not valid msgpack ({type(exc).__name__})") from None
    if not isinstance(header, dict):
        raise ProtocolError(f"header must be a map, got {type(header).__name__}")
    if header.get("v") != VERSION:
        raise ProtocolError(f"schema version {header.get('v')!r} is not supported (this side speaks {VERSION})")
    if not isinstance(header.get("op", header.get("topic")), str):
        raise ProtocolError("header needs a string 'op' or 'topic'")
    return header


def frame_bytes(frame: Frame) -> bytes | bytearray | memoryview:
    if isinstance(frame, (bytes, bytearray, memoryview)):
        return frame
    return frame.buffer  # zmq.Frame


def _array(spec: Any, frame: Frame) -> tuple[str, np.ndarray]:
    if not (isinstance(spec, list) and len(spec) == 3 and isinstance(spec[0], str)
            and spec[1] in DTYPES and isinstance(spec[2], list)
            and all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**40 for d in spec[2])):
        raise ProtocolError(f"bad array spec {spec!r}: expected [name, dtype in {sorted(DTYPES)}, shape]")
    name, key, shape = spec
    dtype = np.dtype(DTYPES[key]).newbyteorder("<")
    buf = frame_bytes(frame)
    expected = math.prod(shape) * dtype.itemsize
    if len(buf) != expected:
        raise ProtocolError(f"array {name!r}: {len(buf):,} bytes for shape {shape} of {key} ({expected:,} expected)")
    arr = np.frombuffer(buf, dtype=dtype).reshape(shape)
    arr.flags.writeable = False  # a view of a received frame: copy before changing it
    return name, arr


# ---- field checks ---------------------------------------------------------------------

_MISSING = object()


def field_of(msg: Message | dict[str, Any], name: str, kind: str, *, default: Any = _MISSING,
             low: float | None = None, high: float | None = None, max_len: int | None = None) -> Any:
    """Read a header field and check its type and range.

    kind: "int", "float", "bool", "str", "list[int]", "map", "list". Raises ProtocolError
    naming the field, the value and the expectation.
    """
    header = msg.header if isinstance(msg, Message) else msg
    value = header.get(name, _MISSING)
    if value is _MISSING or value is None:
        if default is _MISSING:
            raise ProtocolError(f"field '{name}' is required")
        return default
    checks: dict[str, Callable[[Any], bool]] = {
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
        "bool": lambda v: isinstance(v, bool),
        "str": lambda v: isinstance(v, str),
        "list[int]": lambda v: isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v),
        "map": lambda v: isinstance(v, dict),
        "list": lambda v: isinstance(v, list),
    }
    ok = checks[kind]
    if not ok(value):
        shown = repr(value) if len(repr(value)) < 80 else repr(value)[:77] + "..."
        raise ProtocolError(f"field '{name}' must be {kind}, got {shown}")
    if low is not None and value < low:
        raise ProtocolError(f"field '{name}' = {value} is below the minimum {low}")
    if high is not None and value > high:
        raise ProtocolError(f"field '{name}' = {value} is above the maximum {high}")
    if max_len is not None and len(value) > max_len:
        raise ProtocolError(f"field '{name}' has {len(value):,} items, more than {max_len:,}")
    return value


# ---- client ops ----------------------------------------------------------------------

# The control ops and who may send each: engine/wire/roles.py


MAX_ID_KEYS = 64  # header keys looked at for the id of a message that does not unpack


def message_id(frames: Sequence[Frame]) -> int | str | None:
    """The 'id' of a message that may not unpack (array frames that do not match its header,
    a header over MAX_HEADER_BYTES, a bad field): so that the error reply reaches the caller
    waiting for it at once. Reads the header map key by key, skipping values, the first
    MAX_ID_KEYS keys at most. None when there is no int (or short str) id to be found."""
    if not frames:
        return None
    try:
        raw = frame_bytes(frames[0])
        unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(len(raw), 1), strict_map_key=False,
                                    ext_hook=_refuse_ext)
        unpacker.feed(raw)
        for _ in range(min(unpacker.read_map_header(), MAX_ID_KEYS)):
            if unpacker.unpack() == "id":
                value = unpacker.unpack()
                ok = (isinstance(value, int) and not isinstance(value, bool)) or (
                    isinstance(value, str) and len(value) <= 64)
                return value if ok else None
            unpacker.skip()
    except Exception:  # garbage: no id to answer with
        return None
    return None


def error_reply(msg_id: int | str | None, code: str, message: str) -> list[bytes | memoryview]:
    return pack({"op": "error", "id": msg_id, "error": {"code": code, "message": message}})


def reply(msg_id: int | str | None, result: dict[str, Any] | None = None,
          arrays: dict[str, np.ndarray] | None = None) -> list[bytes | memoryview]:
    return pack({"op": "reply", "id": msg_id, "result": result or {}}, arrays)


# ---- page metadata on the wire --------------------------------------------------------

PAGE_FIELDS = {"owner": np.int32, "epoch": np.int64, "writer": np.int64, "filled": np.int32, "state": np.uint8}
# Page arrays an engine may add to every keyframe and delta of a pool (when a keyframe carries
# one, the deltas of that pool should too). `refs`: how many live requests hold the page, for
# engines that share pages between requests (vLLM's prefix cache); without it a page is held
# by one request when its state is not FREE, else by none (PoolMirror.holders()).
OPTIONAL_PAGE_FIELDS = {"refs": np.int32}


def page_arrays(meta: dict[str, np.ndarray], index: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The five metadata arrays (all pages, or only `index`), typed for the wire, plus any
    optional page array (OPTIONAL_PAGE_FIELDS) that `meta` holds."""
    out = {}
    if index is not None:
        out["index"] = np.asarray(index, dtype=np.int32)
    for name, dtype in PAGE_FIELDS.items():
        arr = meta[name] if index is None else meta[name][index]
        out[name] = np.ascontiguousarray(arr, dtype=dtype)
    for name, dtype in OPTIONAL_PAGE_FIELDS.items():
        if name in meta:
            arr = meta[name] if index is None else meta[name][index]
            out[name] = np.ascontiguousarray(arr, dtype=dtype)
    return out


def check_page_arrays(msg: Message, num_pages: int | None = None) -> None:
    """Raises ProtocolError unless msg carries the five metadata arrays of equal length, and
    each optional page array it carries (OPTIONAL_PAGE_FIELDS) is 1-D, of its dtype and of
    the same length."""
    lengths = set()
    for name, dtype in PAGE_FIELDS.items():
        arr = msg.arrays.get(name)
        if arr is None or arr.dtype != np.dtype(dtype) or arr.ndim != 1:
            raise ProtocolError(f"page message lacks a 1-D {np.dtype(dtype).name} array {name!r}")
        lengths.add(len(arr))
    if "index" in msg.arrays:
        index = msg.arrays["index"]
        lengths.add(len(index))
        if num_pages is not None and len(index) and (index.min() < 0 or index.max() >= num_pages):
            raise ProtocolError(f"page index outside 0..{num_pages - 1}")
    elif num_pages is not None:
        lengths.add(num_pages)
    if len(lengths) != 1:
        raise ProtocolError(f"page arrays have different lengths: {sorted(lengths)}")
    length = lengths.pop()
    for name, dtype in OPTIONAL_PAGE_FIELDS.items():
        arr = msg.arrays.get(name)
        if arr is None:
            continue
        if arr.dtype != np.dtype(dtype) or arr.ndim != 1:
            raise ProtocolError(f"optional page array {name!r} must be 1-D {np.dtype(dtype).name}, "
                                f"got {arr.ndim}-D {arr.dtype.name}")
        if len(arr) != length:
            raise ProtocolError(f"optional page array {name!r} has {len(arr):,} entries, the other page arrays "
                                f"{length:,}")
        if len(arr) and arr.min() < 0:
            raise ProtocolError(f"optional page array {name!r} holds a negative count ({int(arr.min())})")
