"""KvEventMap: what a vLLM / SGLang KV-event stream says each rank caches (a KvEventState), as
the page map's per-pool arrays, plus the stream's health in a line of text.

One pool per data-parallel rank and storage medium ("rank 0 · GPU"). A block sits at its
stable slot index; its `owner` is the id of its prefix lineage (all blocks sharing a root
hash share one id, so the page map's owner colours colour lineages) and its `state`
WRITTEN; every other slot is FREE. A pool only grows (to the next power of two of its
highest slot), so the grid does not reflow as blocks come and go, and a rank whose blocks
were all cleared keeps its map, empty.

Qt-free: numpy only. Reads a KvEventState (engine.adapters.kv_event_state) and never changes it.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass, field

import numpy as np

from engine.adapters.kv_event_state import NO_MEDIUM, BlockInfo, KvEventState
from engine.client import PoolMirror
from gui.model.page_colors import FREE, FREE_OWNER, WRITTEN
from gui.model.page_grid import PageGrid

MIN_SLOTS = 64
# A rebuild walks every block in Python (about 65 ms for 100,000 here): one that took t seconds
# is followed by the next no sooner than BUILD_SHARE_INVERSE * t after it began, so rebuilding
# takes at most a quarter of the GUI thread.
BUILD_SHARE_INVERSE = 4
RATE_WINDOW_S = 3.0  # events/s is measured over this much of the recent past
# A rank's maps go fastest tier first; engines that send no medium have only the GPU one.
MEDIUM_ORDER = (None, "GPU", "CPU_PINNED", "CPU", "DISK", "EXTERNAL")


def pool_name(rank: int, medium: str | None) -> str:
    return f"rank {rank} · {NO_MEDIUM if medium is None else medium}"


def pool_order(pool: KvPool) -> tuple:
    """Rank first, then medium: fastest tier first, unknown media last by name."""
    known = pool.medium in MEDIUM_ORDER
    return pool.rank, MEDIUM_ORDER.index(pool.medium) if known else len(MEDIUM_ORDER), pool.medium or ""


def slots_for(top: int) -> int:
    """The pool length that holds slots 0..top-1: a power of two, at least MIN_SLOTS."""
    return max(MIN_SLOTS, 1 << max(0, top - 1).bit_length())


@dataclass
class KvPool:
    """One rank's blocks on one medium: `mirror` holds the page map's arrays (owner = lineage
    id, state, filled = tokens), `by_slot` the block at each slot (None when free)."""

    name: str
    rank: int
    medium: str | None
    mirror: PoolMirror
    by_slot: list[BlockInfo | None]
    blocks: int = 0
    lineages: int = 0
    tokens: int = 0
    endpoints: list[str] = field(default_factory=list)

    @property
    def num_slots(self) -> int:
        return self.mirror.num_pages


class EventRate:
    """Events per second over the last `window_s`, from running totals sampled at any rate."""

    def __init__(self, window_s: float = RATE_WINDOW_S):
        self.window_s = window_s
        self.samples: deque[tuple[float, int]] = deque()

    def add(self, now: float, total: int) -> None:
        self.samples.append((now, total))
        # keep one sample at or before the window's start, so the rate spans the whole window
        while len(self.samples) > 2 and self.samples[1][0] <= now - self.window_s:
            self.samples.popleft()

    def per_second(self) -> float:
        if len(self.samples) < 2:
            return 0.0
        (t0, n0), (t1, n1) = self.samples[0], self.samples[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0


class KvEventMap:
    """The maps of every (rank, medium) a KvEventState has held blocks on, in rank order."""

    def __init__(self):
        self.pools: dict[str, KvPool] = {}
        self.lineage_ids: dict[str, int] = {}  # root hash -> owner id; ids are never reused
        self.lineage_blocks: Counter[str] = Counter()  # root hash -> blocks held, every pool
        self._next_lineage = 0
        self._batches: int | None = None  # state.batches when the arrays were last built
        self._build_after = 0.0  # perf_counter time before which no rebuild starts
        self.rate = EventRate()
        self.last_event_at: float | None = None

    def update(self, state: KvEventState, now: float | None = None) -> bool:
        """Rebuild the arrays when `state` applied a batch since the last rebuild; True if it did.
        Always samples the event rate. Large states are rebuilt less often (see
        BUILD_SHARE_INVERSE); a skipped change is picked up by a later call."""
        now = time.monotonic() if now is None else now
        total = sum(state.events.values())
        if total != (self.rate.samples[-1][1] if self.rate.samples else 0):
            self.last_event_at = now
        self.rate.add(now, total)
        started = time.perf_counter()
        if state.batches == self._batches or started < self._build_after:
            return False
        self._batches = state.batches
        held: Counter[str] = Counter()
        seen = set()
        for number in sorted(state.ranks):
            rank = state.ranks[number]
            for medium, blocks in rank.pools.items():
                name = pool_name(number, medium)
                if blocks.blocks or name in self.pools:  # a pool only ever removed from gets no map
                    seen.add(name)
                    self._fill(name, number, medium, list(blocks.blocks.values()), sorted(rank.endpoints), held)
        for name in self.pools.keys() - seen:  # cleared (AllBlocksCleared): the map stays, empty
            pool = self.pools[name]
            rank = state.ranks.get(pool.rank)
            self._fill(name, pool.rank, pool.medium, [], sorted(rank.endpoints) if rank else pool.endpoints, held)
        self.pools = {pool.name: pool for pool in sorted(self.pools.values(), key=pool_order)}
        for root in self.lineage_ids.keys() - held.keys():
            del self.lineage_ids[root]
        self.lineage_blocks = held
        self._build_after = time.perf_counter() + (BUILD_SHARE_INVERSE - 1) * (time.perf_counter() - started)
        return True

    def _lineage(self, root: str) -> int:
        lineage = self.lineage_ids.get(root)
        if lineage is None:
            lineage = self.lineage_ids[root] = self._next_lineage
            self._next_lineage += 1
        return lineage

    def _fill(self, name: str, rank: int, medium: str | None, blocks: list[BlockInfo], endpoints: list[str],
              held: Counter[str]) -> None:
        pool = self.pools.get(name)
        top = max((b.slot for b in blocks), default=-1) + 1
        size = max(pool.num_slots if pool else 0, slots_for(top))
        owner = np.full(size, FREE_OWNER, dtype=np.int32)
        state = np.full(size, FREE, dtype=np.uint8)
        filled = np.zeros(size, dtype=np.int32)
        by_slot: list[BlockInfo | None] = [None] * size
        roots = set()
        if blocks:
            slots = np.fromiter((b.slot for b in blocks), dtype=np.intp, count=len(blocks))
            owner[slots] = [self._lineage(b.root) for b in blocks]
            state[slots] = WRITTEN
            filled[slots] = [b.tokens for b in blocks]
            for block in blocks:
                by_slot[block.slot] = block
                roots.add(block.root)
                held[block.root] += 1
        arrays = {"owner": owner, "state": state, "filled": filled}
        if pool is None or pool.num_slots != size:
            seq = pool.mirror.seq + 1 if pool else 0
            mirror = PoolMirror(name, medium or "", size, 0, seq, arrays, changed=np.arange(size, dtype=np.int32))
            pool = self.pools[name] = KvPool(name, rank, medium, mirror, by_slot)
        else:
            old = pool.mirror.arrays
            pool.mirror.note_changes(np.flatnonzero((old["owner"] != owner) | (old["state"] != state)))
            pool.mirror.arrays = arrays
            pool.mirror.seq += 1
            pool.by_slot = by_slot
        pool.blocks, pool.lineages, pool.tokens = len(blocks), len(roots), int(filled.sum())
        pool.endpoints = endpoints

    # ---- reading --------------------------------------------------------------------------
    def occupied(self, name: str) -> int:
        """Slots of pool `name` holding a block (KeyError for an unknown pool)."""
        return int(np.count_nonzero(self.pools[name].mirror.arrays["state"] == WRITTEN))

    def block_at(self, name: str, slot: int) -> BlockInfo | None:
        """The block at `slot` of pool `name`, None when free; KeyError / IndexError outside."""
        pool = self.pools[name]
        if not 0 <= slot < pool.num_slots:
            raise IndexError(f"slot {slot} is outside 0..{pool.num_slots - 1} of {name}")
        return pool.by_slot[slot]

    def lineage_of(self, root: str) -> int | None:
        """The owner id (colour key) of the lineage rooted at `root`, None when none is held."""
        return self.lineage_ids.get(root)

    def describe(self, name: str, slot: int) -> str:
        """Hover text: the slot, and its block's hash, parent, tokens, medium and lineage root."""
        block = self.block_at(name, slot)
        row, col = PageGrid.for_pages(self.pools[name].num_slots).cell_of(slot)
        lines = [f"{name} · slot {slot:,} (row {row}, col {col})"]
        if block is None:
            return "\n".join(lines + ["free"])
        lines.append(f"hash {block.hash}")
        lines.append(f"parent {block.parent}" if block.parent is not None else "parent none (a prefix's first block)")
        medium = block.medium if block.medium is not None else "not sent"
        lora = f" · LoRA {block.lora_id}" if block.lora_id is not None else ""
        lines.append(f"{block.tokens:,} tokens · medium {medium}{lora}")
        count = self.lineage_blocks.get(block.root, 0)
        itself = " (this block)" if block.root == block.hash else ""
        lines.append(f"root {block.root}{itself} · lineage of {count:,} block{'s' * (count != 1)} held")
        return "\n".join(lines)

    def status_text(self, state: KvEventState, endpoints: list[str]) -> str:
        """The status line in KV-event mode: endpoints, events/s and the stream's health."""
        where = endpoints[0] if len(endpoints) == 1 else f"{len(endpoints)} endpoints"
        total = sum(state.events.values())
        return (f"{where} · {self.rate.per_second():,.0f} events/s · {total:,} events · "
                f"gaps {state.gaps} ({state.gaps_unfilled} unfilled) · replays {state.replays} "
                f"({state.replay_failures} failed) · refused {state.refused}"
                + (f" · {state.notices[-1]}" if state.notices else ""))  # e.g. nothing bound at the endpoint

    def health_details(self, state: KvEventState, endpoints: list[str]) -> str:
        """The status line's tooltip: every endpoint, the recent gaps and refused frames."""
        lines = [f"watching {e} (last seq {state.last_seq.get(e, 'none')})" for e in endpoints]
        lines.append(f"batches {state.batches:,} · duplicates {state.duplicates} · restarts {state.restarts} · "
                     f"sequence jumps {state.seq_jumps} · disconnects {state.disconnects} · "
                     f"removals of unknown blocks {state.unknown_removals}")
        lines.append(f"blocks held {state.block_count():,} of at most {state.max_blocks:,} · batches refused "
                     f"for that limit {state.over_block_limit}")
        for gap in state.recent_gaps:
            lines.append(f"gap on {gap['endpoint']}: expected seq {gap['expected']}, got {gap['got']} "
                         f"({'filled by replay' if gap['filled'] else 'not filled'})")
        lines.append(f"history on connecting {state.history_fetches} ({state.history_failures} failed, "
                     f"{state.history_batches:,} batches) · refused replay answers {state.replay_refused}")
        lines += [f"refused: {message}" for message in state.refusals]
        lines += [f"refused replay answer: {message}" for message in state.replay_refusals]
        lines += [f"notice: {message}" for message in state.notices]
        return "\n".join(lines)
