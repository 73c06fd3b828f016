"""PageBook: vLLM's block pool as PageWarden page arrays, and its requests as `requests` records.

Each snapshot is folded into the five page arrays of the wire protocol plus `refs` (how many
live requests hold the block):

- owner: the slot of the block's oldest live holder (FREE_OWNER when free);
- epoch: how many times the block went from free to held (one allocation each);
- writer: (slot, epoch) tag of the request that held it first in this allocation; a prefix
  cache hit (the block comes back with the content hash it was freed with) keeps the request
  that computed it; a free block keeps its last writer (the GUI shows "last held by");
- filled: tokens of the oldest holder in the block;
- state: WRITTEN while held, FREE otherwise; QUARANTINED from a failed transfer check
  (`quarantine`) until the block is rewritten or freed.

Slots are this agent's own numbers for vLLM's request ids (vLLM has none).
"""

from __future__ import annotations

import time

import numpy as np

from engine.vllm_agent.snapshot import PoolSnapshot
from engine.wire.page_tags import FREE_OWNER, NO_WRITER, PageState, pack_tag
from engine.wire.protocol import PAGE_FIELDS, page_arrays

POOL = "vllm"
MAX_DONE_KEPT = 1_000  # finished requests remembered for their slot (the GUI's "last held by")


class PageBook:
    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.arrays = {name: np.zeros(num_blocks, dtype=dtype) for name, dtype in PAGE_FIELDS.items()}
        self.arrays["owner"][:] = FREE_OWNER
        self.arrays["writer"][:] = NO_WRITER
        self.arrays["state"][:] = PageState.FREE
        self.refs = np.zeros(num_blocks, dtype=np.int32)
        self._hash_at_free: dict[int, bytes | None] = {}
        self._held: dict[int, tuple[str, ...]] = {}  # block -> its holders, oldest first
        self.slots: dict[str, int] = {}
        self._next_slot = 0
        self._records: dict[str, dict] = {}  # live requests' last published record
        self._order: dict[str, None] = {}  # request ids in arrival order (oldest holder first)
        self._last_hash: dict[int, bytes | None] = {}  # held block -> its hash at the last snapshot
        # block -> snapshots that showed it held since its transfer check failed. vLLM recomputes
        # a failed block in the next step (the snapshot then shows it scheduled) and the one
        # after that has run it: two snapshots held means rewritten.
        self.quarantined: dict[int, int] = {}

    def quarantine(self, block_ids) -> np.ndarray:
        """Blocks whose loaded content failed its check: QUARANTINED until rewritten or freed."""
        index = [b for b in block_ids if 0 <= b < self.num_blocks]
        for b in index:
            self.quarantined[b] = 0
            self.arrays["state"][b] = PageState.QUARANTINED
        return np.asarray(sorted(set(index)), dtype=np.int32)

    def slot_of(self, request_id: str) -> int:
        slot = self.slots.get(request_id)
        if slot is None:
            slot = self.slots[request_id] = self._next_slot
            self._next_slot = (self._next_slot + 1) % (1 << 31)
            self._order[request_id] = None
        return slot

    def apply(self, snap: PoolSnapshot) -> tuple[np.ndarray, list[dict]]:
        """Fold one snapshot in: (indices of the pages that changed, `requests` records that changed)."""
        for rid in snap.requests:
            self.slot_of(rid)
        rank = {rid: i for i, rid in enumerate(self._order)}
        held: dict[int, list[tuple[str, int]]] = {}
        for rid, req in snap.requests.items():
            for position, block_id in enumerate(req.block_ids):
                held.setdefault(block_id, []).append((rid, position))
        changed: list[int] = []
        a = self.arrays
        for block_id, where in held.items():
            if not 0 <= block_id < self.num_blocks:
                continue
            where.sort(key=lambda item: rank[item[0]])
            holders = tuple(rid for rid, _ in where)
            oldest, position = where[0]
            filled = max(0, min(self.block_size, snap.requests[oldest].needed_tokens - position * self.block_size))
            if self._held.get(block_id) == holders and a["filled"][block_id] == filled:
                continue
            first = self.slots[oldest]
            if block_id not in self._held:  # free -> held: a new allocation
                a["epoch"][block_id] += 1
                view = snap.blocks.get(block_id)
                reused = view is not None and view.block_hash is not None and \
                    self._hash_at_free.get(block_id) == view.block_hash and a["writer"][block_id] != NO_WRITER
                if not reused:
                    a["writer"][block_id] = pack_tag(first, int(a["epoch"][block_id]))
            a["owner"][block_id] = first
            a["state"][block_id] = PageState.QUARANTINED if block_id in self.quarantined else PageState.WRITTEN
            a["filled"][block_id] = filled
            self.refs[block_id] = len(holders)
            self._held[block_id] = holders
            changed.append(block_id)
        for block_id in [b for b in self._held if b not in held]:
            del self._held[block_id]
            self._hash_at_free[block_id] = self._last_hash.get(block_id)
            a["owner"][block_id] = FREE_OWNER
            a["state"][block_id] = PageState.FREE
            self.refs[block_id] = 0
            changed.append(block_id)
        for block_id in list(self.quarantined):
            self.quarantined[block_id] += 1
            if block_id not in self._held or self.quarantined[block_id] >= 2:
                del self.quarantined[block_id]
                if block_id in self._held:
                    a["state"][block_id] = PageState.WRITTEN
                changed.append(block_id)
        self._last_hash = {b: v.block_hash for b, v in snap.blocks.items()}
        return np.asarray(sorted(changed), dtype=np.int32), self._request_records(snap)

    def _request_records(self, snap: PoolSnapshot) -> list[dict]:
        out = []
        now = time.time()
        for rid, req in snap.requests.items():
            phase = "prefill" if req.needed_tokens < req.prompt_len else "decode"
            record = {"request_id": rid, "slot": self.slots[rid], "tenant": req.tenant or "",
                      "prompt_len": req.prompt_len, "phase": phase, "pages": {POOL: len(req.block_ids)},
                      "tokens": req.output_tokens}
            if self._records.get(rid) != record:
                arrival = self._records.get(rid, {}).get("arrival", now)
                self._records[rid] = {**record, "arrival": arrival}
                out.append({**record, "arrival": arrival})
        for rid, reason in snap.finished.items():
            last = self._records.pop(rid, None) or {"request_id": rid, "slot": self.slot_of(rid), "tenant": "",
                                                     "prompt_len": 0, "tokens": 0, "arrival": now}
            out.append({**last, "phase": "finished", "pages": {POOL: 0}, "finish_reason": reason})
        gone = [rid for rid in self._records if rid not in snap.requests]  # preempted or aborted unseen
        for rid in gone:
            out.append({**self._records.pop(rid), "phase": "queued", "pages": {POOL: 0}})
        for old in list(self._order)[:max(0, len(self._order) - MAX_DONE_KEPT - len(snap.requests))]:
            if old not in snap.requests:
                del self._order[old]
                self.slots.pop(old, None)
        return out

    def keyframe_arrays(self) -> dict[str, np.ndarray]:
        """Every page, copied: the frames go out zero-copy while the next snapshot folds in."""
        return page_arrays({**{k: v.copy() for k, v in self.arrays.items()}, "refs": self.refs.copy()})

    def delta_arrays(self, index: np.ndarray) -> dict[str, np.ndarray]:
        return page_arrays({**self.arrays, "refs": self.refs}, index)

    def live(self) -> int:
        """Requests holding blocks at the last snapshot."""
        return len(self._records)

    def used(self) -> int:
        return len(self._held)
