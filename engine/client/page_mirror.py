"""PageMirror: page metadata rebuilt from `pages/<pool>` keyframes and deltas (Qt-free).

A delta applies only on top of the message just before it (seq + 1); after a gap the pool
is marked stale until the next keyframe, which the owner should then ask for.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.wire.protocol import PAGE_FIELDS, Message, ProtocolError, check_page_arrays


@dataclass
class PoolMirror:
    name: str
    role: str
    num_pages: int
    page_size: int
    seq: int
    arrays: dict[str, np.ndarray]
    stale: bool = False
    changed: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int32))


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
            num_pages = int(msg.get("num_pages", -1))
            check_page_arrays(msg, num_pages)
            arrays = {k: msg.arrays[k].copy() for k in PAGE_FIELDS}
            self.pools[name] = PoolMirror(name, str(msg.get("role", "")), num_pages, int(msg.get("page_size", 0)),
                                          seq, arrays, changed=np.arange(num_pages, dtype=np.int32))
            return True
        if pool is None or pool.stale:
            return False
        if seq != pool.seq + 1:
            pool.stale = True
            self.gaps += 1
            return False
        check_page_arrays(msg, pool.num_pages)
        index = msg.arrays["index"]
        for key in PAGE_FIELDS:
            pool.arrays[key][index] = msg.arrays[key]
        pool.seq = seq
        pool.changed = index.copy()
        return True
