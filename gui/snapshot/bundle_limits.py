"""The limits inside a snapshot bundle, and the readers of its members that hold them.

The outer zip's limits (bundle.py) bound what its members inflate to; a member can still be an
archive or a text that inflates or parses far past its own size (a 0.07 MB bundle whose
pages.npz held a 3 GiB array took 3.2 GB to read; 60 MiB of `{}` lines in events.jsonl, 21 M
dicts and 2.8 GB). So: every array of an .npz is checked from its .npy header before a byte of
it is inflated; events.jsonl is read line by line from the zip, each line counted and sized
before it is parsed; a JSON document's parsed size is estimated (`parsed_cost`) before it is
parsed. Everything inflated is charged to one `ReadBudget` per member and in all, and what is
parsed in all.
Each limit is worked out from what an exporter can write (engine/wire/protocol.py's frame
limits, the engine's telemetry ring); past one, SnapshotError names the member, the value
and the limit. Qt-free.
"""

from __future__ import annotations

import hashlib
import io
import json
import struct
import zipfile
from dataclasses import dataclass, field
from math import prod

import numpy as np

from engine.wire.protocol import MAX_CONTROL_FRAME, MAX_HEADER_BYTES, OPTIONAL_PAGE_FIELDS, PAGE_FIELDS

# The outer zip's, checked against the sizes it declares before anything is inflated (a 4.8 MB
# bundle of four 1 GiB members took 23 s and 5.25 GB to read; zipfile refuses a member whose
# data inflates past its declared size), and now also the ReadBudget's: what is inflated, per
# member and in all, with what is parsed.
MAX_MEMBER_BYTES = 1 << 30
MAX_TOTAL_BYTES = 2 << 30
MAX_MEMBERS = 10_000
# A pool per worker, at most 64 prefill and 64 decode workers (engine.config.MAX_WORKERS_PER_ROLE).
MAX_POOLS = 128
# A pool's pages reach the exporter as page_metadata arrays, each in one control frame of at
# most MAX_CONTROL_FRAME (64 MiB): an int64 array of more than 8 Mi pages could not have come.
MAX_PAGES = MAX_CONTROL_FRAME // 8
# The widest value an npz of a bundle holds: epoch and writer (int64), a first crossing's time (float64).
MAX_ITEMSIZE = 8
# Per pool the page fields and a first crossing's `time`.
MAX_NPZ_ARRAYS = MAX_POOLS * (len(PAGE_FIELDS) + len(OPTIONAL_PAGE_FIELDS) + 1)
# numpy's own default for a header's length (np.save writes 128 bytes for a 1-D array).
MAX_NPY_HEADER = 10_000
# The engine keeps its last 50,000 telemetry messages (engine/server/telemetry.py RECENT_MESSAGES),
# and events.jsonl is a line per message of the window.
MAX_EVENT_LINES = 50_000
# A telemetry message is one header frame of at most MAX_HEADER_BYTES (8 MiB) of msgpack.
MAX_EVENT_LINE_BYTES = MAX_HEADER_BYTES
# The telemetry comes in the first page of one `history` reply, a control frame of at most 64 MiB
# of msgpack; its JSON is 1.4-1.6 times that (measured on metrics, alert and pages messages).
MAX_EVENTS_BYTES = 2 * MAX_CONTROL_FRAME
# What json.loads takes (measured with tracemalloc, tests/gui/snapshot/test_bundle_limits.py): at
# most ~72 bytes per JSON value (a list of `{}`, the worst), and per byte of text 2 bytes when it
# is ASCII without \u escapes, else up to 8 (one character past U+FFFF makes every string 4
# bytes a character); see parsed_cost.
PARSED_BYTES_PER_VALUE = 96
PARSED_BYTES_PER_ASCII_BYTE = 3
PARSED_BYTES_PER_WIDE_BYTE = 9
_CHUNK = 1 << 20
_HEADER_LENGTH = {(1, 0): "<H", (2, 0): "<I"}  # the .npy header's length field, by format version


class SnapshotError(Exception):
    """The bundle cannot be opened at all; the message says why."""


def parsed_cost(text: bytes) -> int:
    """An upper bound of the memory json.loads(text) takes: every value but the first follows a
    `,` or `:` or opens a container, so it is charged PARSED_BYTES_PER_VALUE, and each byte of
    the text its decoded copy and its strings' (PARSED_BYTES_PER_*_BYTE). Counting commas
    inside strings only over-estimates."""
    values = 1 + text.count(b",") + text.count(b":") + text.count(b"[") + text.count(b"{")
    wide = not text.isascii() or b"\\u" in text
    per_byte = PARSED_BYTES_PER_WIDE_BYTE if wide else PARSED_BYTES_PER_ASCII_BYTE
    return per_byte * len(text) + PARSED_BYTES_PER_VALUE * values


class ReadBudget:
    """What reading one bundle holds: bytes inflated, at most `per_member` of one member, and
    with the estimated size of what is parsed (parsed_cost), at most `total` in all. `charge`
    raises SnapshotError before a limit is passed, naming the member, what was to be read and
    the limit. Parsing is charged to the total only: a real state.json is estimated at ~10
    times its size (2.5 times what json.loads takes), and 100,000 requests (all the engine's
    audit keeps) would pass 1 GiB estimated while they take ~0.5 GB."""

    def __init__(self, path, per_member: int = MAX_MEMBER_BYTES, total: int = MAX_TOTAL_BYTES):
        self.path, self.per_member, self.total = str(path), per_member, total
        self.used = 0
        self.members: dict[str, int] = {}

    def check(self, member: str, nbytes: int, what: str, *, parsed: bool = False) -> None:
        """Raise SnapshotError when charging `nbytes` to `member` would pass a limit."""
        of_member = self.members.get(member, 0) + nbytes
        if not parsed and of_member > self.per_member:
            raise SnapshotError(f"{self.path}: {member}: {what} would bring what is inflated of it to "
                                f"{of_member:,} bytes (limit {self.per_member:,} per member); nothing more was read")
        if self.used + nbytes > self.total:
            raise SnapshotError(f"{self.path}: {member}: {what} would bring what is inflated and parsed of the bundle "
                                f"to {self.used + nbytes:,} bytes (limit {self.total:,} in all); nothing more was read")

    def charge(self, member: str, nbytes: int, what: str, *, parsed: bool = False) -> None:
        self.check(member, nbytes, what, parsed=parsed)
        if not parsed:
            self.members[member] = self.members.get(member, 0) + nbytes
        self.used += nbytes


def read_npz(data: bytes, member: str, budget: ReadBudget, wanted=lambda key: True) -> dict[str, np.ndarray]:
    """The arrays of the .npz `data` (bundle member `member`) whose key `wanted` accepts; the
    others are never inflated. Each array's declared size, shape and dtype are checked before
    it is inflated, and only what its header declares is read. Raises SnapshotError past a
    limit; ValueError, EOFError, zipfile.BadZipFile or zlib.error for a damaged archive, or an
    array that is not a flat number array (object arrays: nothing is unpickled)."""
    where = f"{budget.path}: {member}"
    with zipfile.ZipFile(io.BytesIO(data)) as npz:
        infos = npz.infolist()
        if len(infos) > MAX_NPZ_ARRAYS:
            raise SnapshotError(f"{where} holds {len(infos):,} arrays (limit {MAX_NPZ_ARRAYS:,}: {MAX_POOLS} pools "
                                f"of {MAX_NPZ_ARRAYS // MAX_POOLS}); nothing of it was inflated")
        chosen = [(info.filename.removesuffix(".npy"), info) for info in infos
                  if info.filename.endswith(".npy") and wanted(info.filename.removesuffix(".npy"))]
        limit = MAX_NPY_HEADER + MAX_PAGES * MAX_ITEMSIZE
        for _, info in chosen:
            if info.file_size > limit:
                raise SnapshotError(f"{where}: {info.filename} declares {info.file_size:,} bytes inflated (limit "
                                    f"{limit:,}: {MAX_PAGES:,} pages of {MAX_ITEMSIZE}-byte values); nothing of it "
                                    f"was inflated")
        declared = sum(info.file_size for _, info in chosen)
        budget.check(member, declared, f"its arrays, declaring {declared:,} bytes in all,")
        return {key: _read_npy(npz, info, where, member, budget) for key, info in chosen}


def _read_npy(npz: zipfile.ZipFile, info: zipfile.ZipInfo, where: str, member: str, budget: ReadBudget):
    """One array, its declared size already checked: header, then exactly the bytes it declares."""
    with npz.open(info) as stream:
        version = np.lib.format.read_magic(stream)
        if version not in _HEADER_LENGTH:
            raise ValueError(f"{info.filename}: .npy format {version[0]}.{version[1]} is not read")
        # numpy reads the whole header before it checks its length: check it first
        length_field = stream.read(struct.calcsize(_HEADER_LENGTH[version]))
        if len(length_field) != struct.calcsize(_HEADER_LENGTH[version]):
            raise EOFError(f"{info.filename} ends in its .npy header")
        (length,) = struct.unpack(_HEADER_LENGTH[version], length_field)
        if length > MAX_NPY_HEADER:
            raise SnapshotError(f"{where}: {info.filename} declares a .npy header of {length:,} bytes (limit "
                                f"{MAX_NPY_HEADER:,}); it was not read")
        header = io.BytesIO(length_field + stream.read(length))
        read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                       else np.lib.format.read_array_header_2_0)
        shape, _fortran, dtype = read_header(header, max_header_size=MAX_NPY_HEADER)
        count = prod(shape)
        if count > MAX_PAGES:
            raise SnapshotError(f"{where}: {info.filename} declares shape {shape}, {count:,} values (limit "
                                f"{MAX_PAGES:,} pages); nothing of it was inflated")
        if dtype.hasobject or dtype.kind not in "biuf" or dtype.itemsize > MAX_ITEMSIZE or len(shape) > 1:
            raise ValueError(f"{info.filename} is {dtype.str} of shape {shape}, not a flat array of numbers "
                             f"(a pickled or structured array is never loaded)")
        nbytes = count * dtype.itemsize
        if info.file_size != stream.tell() + nbytes:
            raise ValueError(f"{info.filename} holds {info.file_size:,} bytes but its header declares "
                             f"{stream.tell() + nbytes:,}")
        budget.charge(member, nbytes, f"{info.filename} ({count:,} values of {dtype.str})")
        array = np.empty(count, dtype)
        raw = memoryview(array.view(np.uint8))
        done = 0
        while done < nbytes:
            got = stream.readinto(raw[done:done + _CHUNK])
            if not got:
                raise EOFError(f"{info.filename} ends after {done:,} of {nbytes:,} bytes")
            done += got
    return array.reshape(shape)


def is_pool(arrays: dict[str, np.ndarray]) -> bool:
    """Whether a pool's arrays hold every one of PAGE_FIELDS, each flat and of one length."""
    return (set(PAGE_FIELDS) <= set(arrays) and all(a.ndim == 1 for a in arrays.values())
            and len({a.size for a in arrays.values()}) == 1)


@dataclass
class JsonLines:
    """A JSON-lines member read under the limits: its objects (other values are skipped), the
    sha256 of all its bytes, and what could not be read."""

    records: list[dict]
    sha256: str
    problems: list[str] = field(default_factory=list)


def read_jsonl(zf: zipfile.ZipFile, info: zipfile.ZipInfo, budget: ReadBudget) -> JsonLines:
    """Read member `info` (events.jsonl) from `zf` line by line: at most MAX_EVENTS_BYTES,
    MAX_EVENT_LINES lines of at most MAX_EVENT_LINE_BYTES each, each line charged to `budget`
    (parsed_cost) before it is parsed. A line that is not JSON is a problem and ends the
    parsing (the rest is still hashed). Raises SnapshotError past a limit, before reading past
    it; zipfile.BadZipFile, zlib.error, EOFError or OSError when the member is damaged."""
    member, where = info.filename, f"{budget.path}: {info.filename}"
    if info.file_size > MAX_EVENTS_BYTES:
        raise SnapshotError(f"{where} declares {info.file_size:,} bytes (limit {MAX_EVENTS_BYTES:,}); "
                            f"nothing of it was read")
    digest, records, problems = hashlib.sha256(), [], []
    inflated, parsing = 0, True
    with zf.open(info) as stream:
        number = 0
        while line := stream.readline(MAX_EVENT_LINE_BYTES + 1):
            number += 1
            inflated += len(line)
            if number > MAX_EVENT_LINES:
                raise SnapshotError(f"{where} has more than {MAX_EVENT_LINES:,} lines (limit {MAX_EVENT_LINES:,}); "
                                    f"nothing past line {MAX_EVENT_LINES:,} was parsed")
            text = line[:-1] if line.endswith(b"\n") else line
            if len(text) > MAX_EVENT_LINE_BYTES:
                raise SnapshotError(f"{where}: line {number:,} is longer than {MAX_EVENT_LINE_BYTES:,} bytes "
                                    f"(the limit); nothing more was read")
            if inflated > MAX_EVENTS_BYTES:  # the zip refuses more than declared; this holds even so
                raise SnapshotError(f"{where} inflates past {MAX_EVENTS_BYTES:,} bytes (the limit)")
            digest.update(line)
            if not parsing:
                continue
            cost = parsed_cost(text)
            budget.charge(member, cost, f"line {number:,} (about {cost:,} bytes parsed)", parsed=True)
            try:
                record = json.loads(text)
            except (UnicodeDecodeError, ValueError, RecursionError):  # not JSON, a huge number, too deep
                problems.append(f"{member} line {number:,} cannot be read as JSON; the rest is skipped")
                parsing = False
                continue
            if isinstance(record, dict):
                records.append(record)
    return JsonLines(records, digest.hexdigest(), problems)
