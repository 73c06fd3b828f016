"""The snapshot zip: write it atomically, read it back and check it (docs/SNAPSHOT.md).

Qt-free. `write_bundle` renders every file, hashes it, writes the zip to a temporary file
beside the target and renames it into place (a crash never leaves half a bundle under the
final name). `read_bundle` never trusts the file: an unreadable zip or manifest raises
SnapshotError with a message saying what is wrong; a file whose hash differs from the
manifest, a missing or unexpected file, or a schema problem is a warning on the result.
What the members inflate to and parse into is bounded too (bundle_limits.py).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import tempfile
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from engine.wire.protocol import OPTIONAL_PAGE_FIELDS, PAGE_FIELDS
from gui.snapshot import first_crossing
from gui.snapshot.bundle_limits import (
    MAX_MEMBER_BYTES,
    MAX_MEMBERS,
    MAX_TOTAL_BYTES,
    JsonLines,
    ReadBudget,
    SnapshotError,
    is_pool,
    parsed_cost,
    read_jsonl,
    read_npz,
)
from gui.snapshot.collect import SCHEMA, Snapshot

METRIC_COLUMNS = ("time", "tokens_per_s", "ttft_ms_p50", "ttft_ms_max", "tpot_ms_p50", "queue_depth", "running")
EVENTS = "events.jsonl"  # read line by line, never whole (bundle_limits.read_jsonl)
# What a damaged member raises as it is inflated: a warning, unless the member is essential.
# NotImplementedError: an unknown compression method; RuntimeError: the encrypted flag.
DAMAGED = (zipfile.BadZipFile, zlib.error, OSError, EOFError, ValueError, NotImplementedError, RuntimeError)


@dataclass
class OpenedSnapshot:
    path: Path
    manifest: dict
    state: dict
    pages: dict[str, dict[str, np.ndarray]]
    images: dict[str, bytes]
    events: list[dict]
    warnings: list[str] = field(default_factory=list)
    # pool -> {"time", "reason", "arrays"} from pages-first-crossing.npz ({} in older bundles)
    first_crossing: dict[str, dict] = field(default_factory=dict)

    @property
    def verified(self) -> bool:
        return not self.warnings


def _json(document) -> bytes:
    return json.dumps(document, indent=1, sort_keys=True, default=_plain).encode()


def _plain(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


def pages_npz(pages: dict[str, dict[str, np.ndarray]]) -> bytes:
    out = io.BytesIO()
    np.savez_compressed(out, **{f"{pool}/{key}": np.asarray(arrays[key]) for pool, arrays in pages.items()
                                for key in (*PAGE_FIELDS, *OPTIONAL_PAGE_FIELDS) if key in arrays})
    return out.getvalue()


def metrics_csv(telemetry: list[dict]) -> bytes:
    pools = sorted({p for m in telemetry if m.get("topic") == "metrics" for p in (m.get("pools") or {})})
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*METRIC_COLUMNS, *(f"used_pages:{p}" for p in pools)])
    for m in telemetry:
        if m.get("topic") != "metrics":
            continue
        used = [((m.get("pools") or {}).get(p) or {}).get("used_pages", "") for p in pools]
        writer.writerow([("" if m.get(c) is None else m.get(c)) for c in METRIC_COLUMNS] + used)
    return out.getvalue().encode()


def events_jsonl(telemetry: list[dict]) -> bytes:
    return b"".join(json.dumps(m, sort_keys=True, default=_plain).encode() + b"\n" for m in telemetry)


def render_files(snap: Snapshot, progress=None) -> dict[str, bytes]:
    """Every member but manifest.json and report.html, by name."""
    from gui.snapshot.pagemap_png import render_pagemap_png
    from gui.snapshot.report_html import utc
    from gui.snapshot.trace import chrome_trace

    step = progress or (lambda fraction, what: None)
    files = {"state.json": _json(snap.state)}
    step(0.1, "page metadata")
    files["pages.npz"] = pages_npz(snap.pages)
    pools = {p["name"]: p for p in snap.state.get("pools", [])}
    exported = f"at export time, {snap.manifest.get('created_utc') or '?'}"
    for i, (name, arrays) in enumerate(snap.pages.items()):
        step(0.2 + 0.5 * i / max(1, len(snap.pages)), f"page map of {name}")
        files[f"pagemap-{name}.png"] = render_pagemap_png(pools.get(name, {"name": name}), arrays,
                                                         snap.state.get("requests", []), when=exported)
    if snap.first_crossing:
        step(0.7, "page maps at the first crossing")
        files[first_crossing.NPZ] = first_crossing.to_npz(snap.first_crossing)
        for name, frame in snap.first_crossing.items():
            files[first_crossing.png_name(name)] = render_pagemap_png(
                pools.get(name, {"name": name}), frame["arrays"], snap.state.get("requests", []),
                when=f"at the first crossing, {utc(frame['time'])}",
                crossed=first_crossing.crossed_pages(frame["arrays"]))
    step(0.75, "metrics, events, trace")
    files["metrics.csv"] = metrics_csv(snap.telemetry)
    files["events.jsonl"] = events_jsonl(snap.telemetry)
    files["trace.json"] = _json(chrome_trace(snap.state))
    return files


def _entry(name: str, data: bytes) -> dict:
    return {"name": name, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def write_bundle(snap: Snapshot, path: str | Path, progress=None) -> Path:
    """Write the bundle to `path` atomically; returns the path. progress(fraction, what)."""
    from gui.snapshot.report import render_report

    path = Path(path)
    step = progress or (lambda fraction, what: None)
    files = render_files(snap, step)
    manifest = {**snap.manifest, "files": [_entry(n, d) for n, d in sorted(files.items())]}
    images = {n: d for n, d in files.items() if n.endswith(".png")}
    step(0.85, "report")
    files["report.html"] = render_report(manifest, snap.state, images).encode()
    manifest["files"].append(_entry("report.html", files["report.html"]))
    files["manifest.json"] = _json(manifest)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as raw, zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as zf:
            names = ("manifest.json", *sorted(n for n in files if n != "manifest.json"))
            for i, name in enumerate(names):
                step(0.9 + 0.1 * i / len(names), f"writing {name}")  # may raise: cancelled
                zf.writestr(name, files[name])
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, path)  # the last step: once here, the bundle is written
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_bundle(path: str | Path) -> OpenedSnapshot:
    """Open and check a bundle. Raises SnapshotError when it cannot be shown at all, or when
    a member would inflate or parse past a limit (bundle_limits.py)."""
    path = Path(path)
    try:
        zf = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise SnapshotError(f"{path}: no such file") from None
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError) as exc:
        # NotImplementedError: a version needed to extract past zipfile's; ValueError: a name not UTF-8
        raise SnapshotError(f"{path} is not a readable zip file ({exc}); it may be truncated") from None
    with zf:
        members = {}
        infos = zf.infolist()
        if len(infos) > MAX_MEMBERS:
            raise SnapshotError(f"{path}: {len(infos):,} members (limit {MAX_MEMBERS:,})")
        total = sum(info.file_size for info in infos)
        if total > MAX_TOTAL_BYTES:
            raise SnapshotError(f"{path}: its members claim {total:,} bytes in all (limit {MAX_TOTAL_BYTES:,}); "
                                f"nothing was inflated")
        budget = ReadBudget(path, MAX_MEMBER_BYTES, MAX_TOTAL_BYTES)
        for info in infos:
            if info.file_size > MAX_MEMBER_BYTES:
                raise SnapshotError(f"{path}: member {info.filename} claims {info.file_size:,} bytes "
                                    f"(limit {MAX_MEMBER_BYTES:,})")
            try:
                if info.filename == EVENTS:
                    members[info.filename] = read_jsonl(zf, info, budget)
                else:
                    budget.charge(info.filename, info.file_size, f"its {info.file_size:,} bytes")
                    members[info.filename] = zf.read(info)
            except DAMAGED as exc:
                members[info.filename] = exc  # a damaged member: a warning, unless it is essential
    return _check(path, members, budget)


def _load_json(path: Path, members: dict, name: str, budget: ReadBudget) -> dict:
    data = members.get(name)
    if data is None:
        raise SnapshotError(f"{path}: the bundle has no {name}")
    if isinstance(data, Exception):
        raise SnapshotError(f"{path}: {name} cannot be read ({data})")
    cost = parsed_cost(data)
    budget.charge(name, cost, f"parsing it (about {cost:,} bytes)", parsed=True)
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SnapshotError(f"{path}: {name} is not valid JSON ({exc})") from None
    except RecursionError:
        raise SnapshotError(f"{path}: {name} nests too deeply to read") from None
    except ValueError as exc:  # e.g. an integer longer than Python converts
        raise SnapshotError(f"{path}: {name} cannot be read ({exc})") from None
    if not isinstance(document, dict):
        raise SnapshotError(f"{path}: {name} must hold a JSON object, not {type(document).__name__}")
    return document


def _sha256(data: bytes | JsonLines) -> str:
    return data.sha256 if isinstance(data, JsonLines) else hashlib.sha256(data).hexdigest()


def _check(path: Path, members: dict, budget: ReadBudget) -> OpenedSnapshot:
    from gui.snapshot.schema import validate

    manifest = _load_json(path, members, "manifest.json", budget)
    if manifest.get("schema") != SCHEMA:
        raise SnapshotError(f"{path}: manifest schema {manifest.get('schema')!r} is not {SCHEMA!r}")
    warnings = list(validate("manifest.json", manifest))  # each names its file
    listed = {f.get("name"): f for f in manifest.get("files", []) if isinstance(f, dict)}
    for name, entry in sorted(listed.items()):
        data = members.get(name)
        if data is None:
            warnings.append(f"{name} is listed in the manifest but missing from the bundle")
        elif isinstance(data, Exception):
            warnings.append(f"{name} cannot be read ({data})")
        elif _sha256(data) != entry.get("sha256"):
            warnings.append(f"{name} does not match its sha256 in the manifest: it was changed after export")
    for name in sorted(set(members) - set(listed) - {"manifest.json"}):
        warnings.append(f"{name} is in the bundle but not in the manifest")
    state = _load_json(path, members, "state.json", budget)
    warnings += validate("state.json", state)
    pages = _pages(members.get("pages.npz"), warnings, budget)
    images = {n: d for n, d in members.items() if n.endswith(".png") and isinstance(d, bytes)}
    events = _events(members.get(EVENTS), warnings)
    crossing = first_crossing.from_npz(members.get(first_crossing.NPZ), warnings, budget)
    return OpenedSnapshot(path, manifest, state, pages, images, events, warnings, crossing)


def _pages(data, warnings: list[str], budget: ReadBudget | None = None) -> dict[str, dict[str, np.ndarray]]:
    """pages.npz's pools, each with all of PAGE_FIELDS of one length; a damaged archive or
    pool is a warning. Raises SnapshotError past a limit (bundle_limits.read_npz)."""
    if not isinstance(data, bytes):
        warnings.append("pages.npz is missing or unreadable: no page maps")
        return {}
    budget = budget or ReadBudget("pages.npz")
    pages: dict[str, dict[str, np.ndarray]] = {}
    try:
        arrays = read_npz(data, "pages.npz", budget, wanted=_is_page_array)
    except SnapshotError:
        raise
    except Exception as exc:  # noqa: BLE001 - a damaged archive raises many kinds (zipfile, zlib, numpy)
        warnings.append(f"pages.npz cannot be read ({type(exc).__name__}: {exc}): no page maps")
        return {}
    for key, array in arrays.items():
        pool, _, name = key.rpartition("/")
        pages.setdefault(pool, {})[name] = array
    for pool, arrays in list(pages.items()):
        if not is_pool(arrays):
            warnings.append(f"pages.npz: pool {pool} has arrays {sorted(arrays)} of lengths "
                            f"{sorted({a.size for a in arrays.values()})}; it is left out")
            del pages[pool]
    return pages


def _is_page_array(key: str) -> bool:
    pool, _, name = key.rpartition("/")
    return bool(pool) and (name in PAGE_FIELDS or name in OPTIONAL_PAGE_FIELDS)


def _events(data, warnings: list[str]) -> list[dict]:
    if not isinstance(data, JsonLines):
        return []
    warnings += data.problems
    return data.records
