"""PageHistory: the page maps of the last minutes, so that an operator can look back (Qt-free).

Leaked pages are freed within seconds: by the time someone looks at the live map they are
gone. The window records the mirror at most every `interval_s` when a page changed, as
deltas against the previous frame (the first frame, and one frame in `KEYFRAME_EVERY`,
hold every page), with the requests that owned pages then (a slot is reused by later
requests). What it keeps is bounded twice: frames older than `window_s` go, and the oldest
go while the frames hold more than `budget_bytes`. `frame(i)` rebuilds frame i as
PoolMirrors that a page map draws like live ones. A pool's optional page arrays (`refs`)
are recorded with the five others; a pool that gains or loses one gets a full frame.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from engine.client.page_mirror import PageMirror, PoolMirror
from engine.wire.protocol import OPTIONAL_PAGE_FIELDS, PAGE_FIELDS

WINDOW_S = 600.0  # ten minutes, like the metric plots
INTERVAL_S = 0.25  # at most four frames a second
BUDGET_BYTES = 96 << 20
KEYFRAME_EVERY = 64  # a full frame this often: rebuilding any frame applies < 64 deltas
ENTRY_BYTES = 96  # what one slot -> request entry costs, counted against the budget


@dataclass(frozen=True)
class _PoolShape:
    role: str
    num_pages: int
    page_size: int
    fields: tuple[str, ...] = tuple(PAGE_FIELDS)  # the page arrays recorded: the five, plus `refs` if sent


def _fields(pool: PoolMirror) -> tuple[str, ...]:
    return (*PAGE_FIELDS, *(k for k in OPTIONAL_PAGE_FIELDS if k in pool.arrays))


@dataclass
class _Stored:
    """One recorded frame: per pool either every page (full) or the pages that changed."""

    time: float  # wall clock
    shapes: dict[str, _PoolShape]
    full: dict[str, dict[str, np.ndarray]]  # pool -> every field (new pools, keyframes)
    delta: dict[str, tuple[np.ndarray, dict[str, np.ndarray]]]  # pool -> (pages, their fields)
    owners: dict[int, tuple[str, str | None]]  # slot -> (request id, tenant) of pages held then
    nbytes: int = 0

    def is_key(self) -> bool:
        return not self.delta and set(self.full) == set(self.shapes)


@dataclass(frozen=True)
class HistoryFrame:
    """A page map as it was: pools (PoolMirror, drawable), and who owned which slot."""

    index: int  # position in the history when it was asked for
    time: float
    pools: dict[str, PoolMirror]
    owners: dict[int, tuple[str, str | None]] = field(default_factory=dict)

    def request_of_slot(self, slot: int) -> str | None:
        entry = self.owners.get(slot)
        return entry[0] if entry else None

    def tenant_of_slot(self, slot: int) -> str | None:
        entry = self.owners.get(slot)
        return entry[1] if entry else None


def _nbytes(arrays: dict[str, np.ndarray]) -> int:
    return sum(a.nbytes for a in arrays.values())


class PageHistory:
    def __init__(self, window_s: float = WINDOW_S, interval_s: float = INTERVAL_S,
                 budget_bytes: int = BUDGET_BYTES):
        if window_s <= 0 or interval_s < 0 or budget_bytes <= 0:
            raise ValueError(f"history needs window_s > 0, interval_s >= 0 and budget_bytes > 0; got "
                             f"{window_s}, {interval_s}, {budget_bytes}")
        self.window_s, self.interval_s, self.budget_bytes = window_s, interval_s, budget_bytes
        self._frames: deque[_Stored] = deque()
        self._last: dict[str, dict[str, np.ndarray]] = {}  # every pool's arrays as last recorded
        self._last_shapes: dict[str, _PoolShape] = {}
        self._last_owners: dict[int, tuple[str, str | None]] = {}
        self._since_key = 0
        self.nbytes = 0
        self.dropped = 0  # frames that went for the window or the budget

    def __len__(self) -> int:
        return len(self._frames)

    def times(self) -> list[float]:
        return [f.time for f in self._frames]

    def record(self, mirror: PageMirror, owner_of_slot, now: float) -> bool:
        """Record the mirror as it is at wall time `now` if a page changed since the last
        frame and `interval_s` has passed. owner_of_slot(slot) -> (request id, tenant) or
        None. True if a frame was added."""
        if self._frames and now - self._frames[-1].time < self.interval_s:
            return False
        pools = {name: pool for name, pool in mirror.pools.items() if not pool.stale}
        shapes = {name: _PoolShape(p.role, p.num_pages, p.page_size, _fields(p)) for name, p in pools.items()}
        key = not self._frames or self._since_key + 1 >= KEYFRAME_EVERY
        full, delta = {}, {}
        for name, pool in pools.items():
            last = self._last.get(name)
            if key or last is None or shapes[name] != self._last_shapes.get(name):
                full[name] = {k: pool.arrays[k].copy() for k in shapes[name].fields}
                continue
            differs = np.zeros(pool.num_pages, dtype=bool)
            for k in shapes[name].fields:
                differs |= pool.arrays[k] != last[k]
            index = np.flatnonzero(differs).astype(np.int32)
            if len(index):
                delta[name] = (index, {k: pool.arrays[k][index].copy() for k in shapes[name].fields})
        if self._frames and not full and not delta and shapes == self._last_shapes:
            return False  # nothing changed: the last frame still says it
        owners = self._owners(pools, owner_of_slot)
        nbytes = sum(_nbytes(a) for a in full.values()) + sum(i.nbytes + _nbytes(a) for i, a in delta.values())
        nbytes += ENTRY_BYTES * len(owners) if owners is not self._last_owners else 0
        self._frames.append(_Stored(now, shapes, full, delta, owners, nbytes))
        self.nbytes += nbytes
        self._since_key = 0 if key else self._since_key + 1
        for name, arrays in full.items():
            self._last[name] = {k: v.copy() for k, v in arrays.items()}
        for name, (index, values) in delta.items():
            for k, v in values.items():
                self._last[name][k][index] = v
        for gone in set(self._last) - set(pools):
            del self._last[gone]
        self._last_shapes, self._last_owners = shapes, owners
        self._evict(now)
        return True

    def _owners(self, pools: dict[str, PoolMirror], owner_of_slot) -> dict[int, tuple[str, str | None]]:
        slots = set()
        for pool in pools.values():
            owner = pool.arrays["owner"]
            slots.update(int(s) for s in np.unique(owner[owner >= 0]))
        owners = {}
        for slot in slots:
            entry = owner_of_slot(slot)
            if entry is not None:
                owners[slot] = entry
        return self._last_owners if owners == self._last_owners else owners  # shared when unchanged

    def _evict(self, now: float) -> None:
        while len(self._frames) > 1 and (now - self._frames[0].time > self.window_s
                                         or self.nbytes > self.budget_bytes):
            first = self._frames.popleft()
            self.nbytes -= first.nbytes
            self.dropped += 1
            self._make_key(first, self._frames[0])

    def _make_key(self, gone: _Stored, new_first: _Stored) -> None:
        """The first frame must hold every page: fold the one that went into the next."""
        if new_first.is_key():
            return
        for name, shape in new_first.shapes.items():
            if name in new_first.full:
                continue
            arrays = gone.full[name]  # the frame that went was full: its arrays are free to reuse
            if name in new_first.delta:
                index, values = new_first.delta.pop(name)
                for k, v in values.items():
                    arrays[k][index] = v
                new_first.nbytes -= index.nbytes + _nbytes(values)
                self.nbytes -= index.nbytes + _nbytes(values)
            new_first.full[name] = arrays
            new_first.nbytes += _nbytes(arrays)
            self.nbytes += _nbytes(arrays)
        new_first.delta.clear()

    def frame(self, i: int) -> HistoryFrame:
        """Frame i (0 the oldest; negative from the newest) rebuilt; IndexError outside."""
        n = len(self._frames)
        if not -n <= i < n:
            raise IndexError(f"history frame {i} out of range: {n} frames kept")
        i %= n
        start = i
        while not self._frames[start].is_key():
            start -= 1
        arrays: dict[str, dict[str, np.ndarray]] = {}
        for stored in list(self._frames)[start:i + 1]:
            for name in list(arrays):
                if name not in stored.shapes:
                    del arrays[name]
            for name, full in stored.full.items():
                arrays[name] = {k: v.copy() for k, v in full.items()}
            for name, (index, values) in stored.delta.items():
                for k, v in values.items():
                    arrays[name][k][index] = v
        stored = self._frames[i]
        pools = {}
        for name, shape in stored.shapes.items():
            pools[name] = PoolMirror(name, shape.role, shape.num_pages, shape.page_size, -1, arrays[name])
        return HistoryFrame(i, stored.time, pools, stored.owners)

    def index_at(self, t: float) -> int | None:
        """The newest frame at or before wall time t (None: before every frame)."""
        times = self.times()
        i = int(np.searchsorted(np.asarray(times), t, side="right")) - 1
        return i if i >= 0 else None
