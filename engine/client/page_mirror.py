"""PageMirror: page metadata rebuilt from `pages/<pool>` keyframes and deltas (Qt-free).

A delta applies only on top of the message just before it (seq + 1); after a gap the pool
is marked stale until the next keyframe, which the owner should then ask for. Each pool
collects the pages changed since its reader last took them (`PoolMirror.take_changes`), so
a reader that skips messages still recomputes only what changed.

A pool keeps the optional page arrays (OPTIONAL_PAGE_FIELDS: `refs`) its keyframe carries;
`PoolMirror.holders()` says how many requests hold each page, with or without `refs`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.wire.page_tags import PageState
from engine.wire.protocol import OPTIONAL_PAGE_FIELDS, PAGE_FIELDS, Message, ProtocolError, check_page_arrays

_FREE = int(PageState.FREE)


@dataclass
class PoolMirror:
    """One pool's page arrays. `changed` holds the last message's pages; the pages changed
    since the last `take_changes()` are collected separately for the pool's one reader."""

    name: str
    role: str
    num_pages: int
    page_size: int
    seq: int
    arrays: dict[str, np.ndarray]
    stale: bool = False
    changed: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int32))
    _pending: list[np.ndarray] = field(default_factory=list, repr=False)
    _pending_count: int = field(default=0, repr=False)
    _all_pending: bool = field(default=True, repr=False)  # a new pool: every page is new

    @property
    def has_refs(self) -> bool:
        """The engine says how many requests hold each page (it shares pages: vLLM)."""
        return "refs" in self.arrays

    def holders(self, index=None) -> np.ndarray:
        """int32 per page (or per page of `index`): how many live requests hold it. The
        pool's `refs` when its engine sends them; otherwise 1 for a page whose state is not
        FREE, 0 for a free one (an engine that never shares pages)."""
        refs = self.arrays.get("refs")
        if refs is not None:
            return refs if index is None else refs[index]
        state = self.arrays["state"] if index is None else self.arrays["state"][index]
        return (np.asarray(state) != _FREE).astype(np.int32)

    def shared_pages(self) -> np.ndarray:
        """The pages (int32, ascending) held by more than one request; empty without `refs`."""
        if not self.has_refs:
            return np.empty(0, dtype=np.int32)
        return np.flatnonzero(self.holders() > 1).astype(np.int32)

    def note_changes(self, index: np.ndarray | None) -> None:
        """Record pages changed by the message just applied (None: every page)."""
        if index is None:
            self.changed = np.arange(self.num_pages, dtype=np.int32)
            self._pending, self._pending_count, self._all_pending = [], 0, True
            return
        self.changed = np.asarray(index, dtype=np.int32).copy()
        if self._all_pending or not len(self.changed):
            return
        self._pending.append(self.changed)
        self._pending_count += len(self.changed)
        if self._pending_count > self.num_pages:  # bound the memory of an unread pool
            merged = np.unique(np.concatenate(self._pending))
            self._pending, self._pending_count = [merged], len(merged)

    def take_changes(self) -> np.ndarray | None:
        """The sorted distinct pages (int32) changed since the last call, or None when every
        page must be redrawn (a new pool). Clears what it returns: one reader per pool."""
        if self._all_pending:
            changes = None
        elif not self._pending:
            changes = np.empty(0, dtype=np.int32)
        else:
            changes = np.unique(np.concatenate(self._pending)).astype(np.int32, copy=False)
        self._pending, self._pending_count, self._all_pending = [], 0, False
        return changes


class PageMirror:
    def __init__(self):
        self.pools: dict[str, PoolMirror] = {}
        self.gaps = 0

    def stale_pools(self) -> list[str]:
        return [name for name, pool in self.pools.items() if pool.stale]

    def apply(self, msg: Message) -> bool:
        """Apply one pages message. True if the mirror changed; False when it could not be
        applied (unknown pool before a keyframe, or a sequence gap). Raises ProtocolError
        for a malformed message."""
        name, kind, seq = msg.get("pool"), msg.get("kind"), msg.get("seq")
        if not isinstance(name, str) or kind not in ("keyframe", "delta") or not isinstance(seq, int):
            raise ProtocolError("pages message needs pool, kind (keyframe|delta) and seq")
        pool = self.pools.get(name)
        if kind == "keyframe":
            self._keyframe(name, seq, msg, pool)
            return True
        if pool is None or pool.stale:
            return False
        if seq != pool.seq + 1:
            pool.stale = True
            self.gaps += 1
            return False
        check_page_arrays(msg, pool.num_pages)
        index = msg.arrays["index"]
        if "refs" in msg.arrays and "refs" not in pool.arrays:  # refs from now on: the rest has the default
            pool.arrays["refs"] = pool.holders()
        elif "refs" in pool.arrays and "refs" not in msg.arrays:  # these pages fall back to the default
            pool.arrays["refs"][index] = (msg.arrays["state"] != _FREE).astype(np.int32)
        for key in (*PAGE_FIELDS, *(k for k in OPTIONAL_PAGE_FIELDS if k in msg.arrays)):
            pool.arrays[key][index] = msg.arrays[key]
        pool.seq = seq
        pool.note_changes(index)
        return True

    def _keyframe(self, name: str, seq: int, msg: Message, pool: PoolMirror | None) -> None:
        num_pages = int(msg.get("num_pages", -1))
        check_page_arrays(msg, num_pages)
        arrays = {k: msg.arrays[k].copy() for k in (*PAGE_FIELDS, *OPTIONAL_PAGE_FIELDS) if k in msg.arrays}
        role, page_size = str(msg.get("role", "")), int(msg.get("page_size", 0))
        if pool is None or (pool.num_pages, pool.role, pool.page_size) != (num_pages, role, page_size):
            self.pools[name] = PoolMirror(name, role, num_pages, page_size, seq, arrays,
                                          changed=np.arange(num_pages, dtype=np.int32))
            return
        # the same pool again (a resync): what differs from the mirror is what changed
        differs = np.zeros(num_pages, dtype=bool)
        for key in PAGE_FIELDS:
            differs |= pool.arrays[key] != arrays[key]
        if pool.has_refs or "refs" in arrays:  # refs came or went: compare who holds each page
            before = pool.holders()
            after = PoolMirror(name, role, num_pages, page_size, seq, arrays).holders()
            differs |= before != after
        pool.arrays, pool.seq, pool.stale = arrays, seq, False
        pool.note_changes(np.flatnonzero(differs))
