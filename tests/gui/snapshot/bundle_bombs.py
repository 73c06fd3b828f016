"""Bundles whose members inflate or parse far past their size, and the peak memory of reading
one, measured in a child process.

`npz_bomb`: pages.npz holds one array whose .npy header declares `gib` GiB of int32 (by
default 3 GiB, a 0.07 MB bundle). `events_bomb`: events.jsonl holds `mib` MiB of `{}` lines
(by default 60 MiB, 21 M lines). `state_bomb`: state.json holds `mib` MiB of `{}` in a list.
Each is otherwise the valid bundle it is made from.
Neither is inflated here: the npz's deflate stream is one compressed MiB of zeros repeated.
"""

from __future__ import annotations

import io
import json
import struct
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[3]
_MIB = 1 << 20


def _deflated(header: bytes, zeros_mib: int) -> tuple[bytes, int]:
    """A raw deflate stream of `header` then `zeros_mib` MiB of zeros, and its CRC-32. After a
    full flush the compressor starts afresh, so every MiB of zeros compresses to the same block."""
    zeros = bytes(_MIB)
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = compressor.compress(header) + compressor.flush(zlib.Z_FULL_FLUSH)
    block = compressor.compress(zeros) + compressor.flush(zlib.Z_FULL_FLUSH)
    again = compressor.compress(zeros) + compressor.flush(zlib.Z_FULL_FLUSH)
    assert block == again, "the compressor did not restart after a full flush"
    tail = compressor.flush()
    crc = zlib.crc32(header)
    for _ in range(zeros_mib):
        crc = zlib.crc32(zeros, crc)
    return head + block * zeros_mib + tail, crc


def _zip_of_one_deflated(name: str, data: bytes, crc: int, size: int) -> bytes:
    """A zip of one member whose deflated bytes are already made (zipfile cannot take them)."""
    encoded = name.encode()
    local = struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, zipfile.ZIP_DEFLATED, 0, 0x21, crc, len(data), size,
                        len(encoded), 0)
    central = struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, zipfile.ZIP_DEFLATED, 0, 0x21, crc,
                          len(data), size, len(encoded), 0, 0, 0, 0, 0, 0)
    body = local + encoded + data
    directory = central + encoded
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 1, 1, len(directory), len(body), 0)
    return body + directory + end


def npy_header(shape: tuple, dtype="<i4") -> bytes:
    """An .npy file's magic, version 1.0 and header for `shape` and `dtype`, as numpy writes it."""
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, {"descr": np.dtype(dtype).str, "fortran_order": False,
                                               "shape": shape})
    return out.getvalue()


def npz_bomb_member(gib: int = 3, key: str = "decode-0/owner") -> bytes:
    """An npz of one int32 array `key` of `gib` GiB of zeros, a few MB deflated."""
    header = npy_header(((gib << 30) // 4,))
    data, crc = _deflated(header, gib << 10)
    return _zip_of_one_deflated(f"{key}.npy", data, crc, len(header) + (gib << 30))


def replace_member(src: Path, dst: Path, name: str, data: bytes) -> Path:
    """A copy of bundle `src` with member `name` replaced by `data` (deflated)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, data if info.filename == name else zin.read(info))
    return dst


def npz_bomb(src: Path, dst: Path, gib: int = 3) -> Path:
    return replace_member(src, dst, "pages.npz", npz_bomb_member(gib))


def events_bomb(src: Path, dst: Path, mib: int = 60) -> Path:
    return replace_member(src, dst, "events.jsonl", b"{}\n" * (mib * _MIB // 3))


def state_bomb(src: Path, dst: Path, mib: int = 100) -> Path:
    """state.json with a key holding `mib` MiB of `{}` in a list, the rest of it valid."""
    with zipfile.ZipFile(src) as zf:
        state = zf.read("state.json")
    padding = b'{"padding": [' + b",".join([b"{}"] * (mib * _MIB // 3)) + b"], "
    return replace_member(src, dst, "state.json", padding + state.lstrip()[1:])


_CHILD = """
import json, sys, time, tracemalloc
from gui.snapshot.bundle import SnapshotError, read_bundle


def status(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


trace = sys.argv[2] == "trace"
if trace:
    tracemalloc.start()
try:  # the high-water mark back to the present RSS (Linux 4.0+): what the imports took is left out
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
except OSError:
    pass  # then the increase counts the imports' peak above the present RSS too: it only over-states
before = status("VmRSS")
start = time.perf_counter()
try:
    opened = read_bundle(sys.argv[1])
    outcome = f"opened, {len(opened.events):,} events, {len(opened.warnings)} warnings"
except SnapshotError as exc:
    outcome = f"SnapshotError: {exc}"
seconds = time.perf_counter() - start
print(json.dumps({"peak_increase_bytes": status("VmHWM") - before, "seconds": seconds, "outcome": outcome,
                  "traced_peak_bytes": tracemalloc.get_traced_memory()[1] if trace else None}))
"""


def reading_cost(path: Path, *, trace: bool = False, timeout: float = 900) -> dict:
    """Read the bundle in a fresh Python: {"peak_increase_bytes" (its peak RSS while reading,
    VmHWM, over its RSS before; not ru_maxrss, which a child inherits from its parent's RSS at
    fork), "seconds", "outcome" (what it opened, or the SnapshotError's message),
    "traced_peak_bytes" (tracemalloc's peak while reading, with `trace`; it slows the reading)}."""
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(path), "trace" if trace else "-"], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"reading {path} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
