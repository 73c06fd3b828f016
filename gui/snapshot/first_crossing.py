"""The page maps at the first crossing, beside those at export time.

Leaked pages are freed within seconds, so the maps at export time show the pools after the
incident (often all free), not the leak. The engine keeps page-map keyframes around each
first crossing and sends them with the first page of its `history` answer as `keyframes`:
[{"time", "pool", "reason", "owner", "epoch", "writer", "filled", "state"}], arrays as lists
with the meaning of pages.npz. Per pool the earliest keyframe of reason "first_crossing" is
kept: in `pages-first-crossing.npz` (pages.npz's layout plus `<pool>/time`) and drawn as
`pagemap-first-crossing-<pool>.png`. state.json's `first_crossing` says which were kept, or
why there are none. Pure Python (no Qt).
"""

from __future__ import annotations

import io

import numpy as np

from engine.wire.protocol import OPTIONAL_PAGE_FIELDS, PAGE_FIELDS

REASON = "first_crossing"
NPZ = "pages-first-crossing.npz"
PNG_PREFIX = "pagemap-first-crossing-"
NO_KEYFRAMES = ("the engine sent no page-map keyframes: it predates them, or its evidence journal is off, "
                "so the pages as they were when data crossed were not kept")
NO_FIRST_CROSSING = ("the engine kept no page-map keyframe of a first crossing in this window (none happened "
                     "in it, or its keyframes were pruned)")


def png_name(pool: str) -> str:
    return f"{PNG_PREFIX}{pool}.png"


def _arrays(frame: dict) -> dict[str, np.ndarray] | None:
    """The page arrays of one keyframe, typed as pages.npz; None when one is missing or the
    lengths differ. Arrays may sit in the frame or in its `arrays` dict."""
    source = frame.get("arrays") if isinstance(frame.get("arrays"), dict) else frame
    out = {}
    try:
        for name, dtype in (*PAGE_FIELDS.items(), *OPTIONAL_PAGE_FIELDS.items()):
            if name in source:
                out[name] = np.asarray(source[name], dtype=dtype).reshape(-1)
    except (TypeError, ValueError, OverflowError):
        return None
    if not set(PAGE_FIELDS) <= set(out) or len({len(a) for a in out.values()}) != 1:
        return None
    return out


def choose(keyframes) -> tuple[dict[str, dict], list[str]]:
    """Per pool the earliest usable first-crossing keyframe {"time", "reason", "arrays"}, and
    a problem line per keyframe that could not be used."""
    chosen: dict[str, dict] = {}
    problems = []
    for i, frame in enumerate(keyframes if isinstance(keyframes, list) else []):
        if not isinstance(frame, dict) or frame.get("reason") != REASON:
            continue
        pool, when = frame.get("pool"), frame.get("time")
        arrays = _arrays(frame)
        if not isinstance(pool, str) or not pool or not isinstance(when, (int, float)) or arrays is None:
            problems.append(f"keyframe {i} (pool {pool!r}) lacks a pool, a time or page arrays of one length")
            continue
        if pool not in chosen or when < chosen[pool]["time"]:
            chosen[pool] = {"time": float(when), "reason": REASON, "arrays": arrays}
    return chosen, problems


def describe(keyframes, chosen: dict[str, dict], problems: list[str]) -> dict:
    """state.json's `first_crossing`: the maps kept, how many keyframes came, and why none was
    kept (None when some were)."""
    received = len(keyframes) if isinstance(keyframes, list) else None
    missing = None
    if not chosen:
        missing = NO_KEYFRAMES if received is None else NO_FIRST_CROSSING
    return {"maps": [{"pool": pool, "time": frame["time"], "reason": frame["reason"],
                      "pages": int(len(frame["arrays"]["owner"]))} for pool, frame in sorted(chosen.items())],
            "keyframes": received, "missing": missing, "problems": problems}


def to_npz(chosen: dict[str, dict]) -> bytes:
    out = io.BytesIO()
    members = {}
    for pool, frame in chosen.items():
        members[f"{pool}/time"] = np.asarray(frame["time"], dtype=np.float64)
        members.update({f"{pool}/{name}": array for name, array in frame["arrays"].items()})
    np.savez_compressed(out, **members)
    return out.getvalue()


def from_npz(data, warnings: list[str], budget=None) -> dict[str, dict]:
    """{pool: {"time", "reason", "arrays"}} from pages-first-crossing.npz bytes; {} (and a
    warning) when it cannot be read. None (the member is absent): {} and no warning. Raises
    SnapshotError when an array passes a limit of bundle_limits (charged to `budget`)."""
    from gui.snapshot.bundle_limits import ReadBudget, SnapshotError, is_pool, read_npz

    if data is None:
        return {}
    if not isinstance(data, bytes):
        warnings.append(f"{NPZ} is unreadable: no first-crossing page maps")
        return {}
    frames: dict[str, dict] = {}
    try:
        arrays = read_npz(data, NPZ, budget or ReadBudget(NPZ), wanted=_is_frame_array)
        for key, array in arrays.items():
            pool, _, name = key.rpartition("/")
            frame = frames.setdefault(pool, {"time": None, "reason": REASON, "arrays": {}})
            if name == "time":
                if array.size != 1:
                    raise ValueError(f"{key} holds {array.size} values, not one time")
                frame["time"] = float(array.reshape(-1)[0])
            else:
                frame["arrays"][name] = array
    except SnapshotError:
        raise
    except Exception as exc:  # noqa: BLE001 - a damaged archive raises many kinds (zipfile, zlib, numpy)
        warnings.append(f"{NPZ} cannot be read ({type(exc).__name__}: {exc}): no first-crossing page maps")
        return {}
    for pool, frame in list(frames.items()):
        arrays = frame["arrays"]
        if not is_pool(arrays):
            warnings.append(f"{NPZ}: pool {pool} has arrays {sorted(arrays)} of lengths "
                            f"{sorted({a.size for a in arrays.values()})}; it is left out")
            del frames[pool]
    return frames


def _is_frame_array(key: str) -> bool:
    pool, _, name = key.rpartition("/")
    return bool(pool) and (name == "time" or name in PAGE_FIELDS or name in OPTIONAL_PAGE_FIELDS)


def crossed_pages(arrays: dict[str, np.ndarray]) -> np.ndarray:
    """A mask of the pages that one request owns and another last wrote: its data crossed."""
    owner = np.asarray(arrays["owner"], dtype=np.int64)
    writer = np.asarray(arrays["writer"], dtype=np.int64)
    return (owner >= 0) & (writer >= 0) & ((writer >> 32) != owner)
