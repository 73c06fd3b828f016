"""KvEventState: what an engine's KV-event stream says its cache holds, per data-parallel rank,
plus the health of the stream itself (refused frames, sequence gaps, replays). Plain Python,
no sockets and no Qt: the watcher feeds it, a view may read it.

A rank's blocks live in one BlockPool per storage medium ("GPU", "CPU", ... or None when the
engine does not say), because vLLM's offloading stores the same hash on GPU and CPU and
removes each copy separately. Within a pool every block keeps one layout slot until it is
removed; freed slots are reused lowest first, so a page map does not reshuffle.

The blocks held, all ranks and media together, are bounded (`max_blocks`): a batch that
would pass the bound is refused whole before any of it is applied, and counted.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from dataclasses import dataclass

from engine.adapters.kv_event_decode import AllBlocksCleared, Batch, BlockRemoved, BlockStored, KvEventError

RECENT = 5  # refusal messages and gaps kept for the summary
NO_MEDIUM = "unspecified"  # the summary's name for blocks whose engine sends no medium
# Blocks held at once, every rank and medium: ~400 bytes each (~0.4 GiB at the bound). A GPU
# holds ~30,000 blocks of 16 tokens of an 8B model, ~400,000 of a 0.5B one.
MAX_BLOCKS = 1 << 20


class BlockLimitError(KvEventError):
    """A batch that would make the state hold more than its `max_blocks`."""


@dataclass(slots=True)
class BlockInfo:
    hash: str
    parent: str | None
    tokens: int
    medium: str | None
    lora_id: int | None
    root: str  # the first ancestor of its lineage this stream has seen (itself when none)
    slot: int


class BlockPool:
    """The blocks of one rank on one medium, each with a stable slot."""

    def __init__(self, medium: str | None):
        self.medium = medium
        self.blocks: dict[str, BlockInfo] = {}
        self._free: list[int] = []  # heap of slots freed by removals
        self._next = 0  # first slot never used

    def store(self, block_hash: str, parent: str | None, tokens: int, lora_id: int | None, root: str) -> BlockInfo:
        """Hold `block_hash` (again): a re-stored block keeps its slot and root."""
        held = self.blocks.get(block_hash)
        if held is not None:
            held.parent, held.tokens, held.lora_id = parent, tokens, lora_id
            return held
        if self._free:
            slot = heapq.heappop(self._free)
        else:
            slot, self._next = self._next, self._next + 1
        info = BlockInfo(block_hash, parent, tokens, self.medium, lora_id, root, slot)
        self.blocks[block_hash] = info
        return info

    def remove(self, block_hash: str) -> bool:
        """Drop `block_hash` and free its slot; False when it was not held."""
        info = self.blocks.pop(block_hash, None)
        if info is None:
            return False
        heapq.heappush(self._free, info.slot)
        return True


class RankState:
    """One data-parallel rank: its pools by medium and the endpoints that reported it."""

    def __init__(self):
        self.pools: dict[str | None, BlockPool] = {}
        self.endpoints: set[str] = set()

    def pool(self, medium: str | None) -> BlockPool:
        if medium not in self.pools:
            self.pools[medium] = BlockPool(medium)
        return self.pools[medium]

    def find(self, block_hash: str, medium: str | None = None) -> BlockInfo | None:
        """The block `block_hash` on `medium`, else on any medium, else None."""
        pool = self.pools.get(medium)
        if pool is not None and block_hash in pool.blocks:
            return pool.blocks[block_hash]
        return next((p.blocks[block_hash] for p in self.pools.values() if block_hash in p.blocks), None)

    def block_count(self) -> int:
        return sum(len(pool.blocks) for pool in self.pools.values())

    def holds(self, block_hash: str, medium: str | None) -> bool:
        pool = self.pools.get(medium)
        return pool is not None and block_hash in pool.blocks


def tokens_in_block(event: BlockStored, index: int) -> int:
    """How many of event.token_ids fall in its index-th block (the last may be partial)."""
    return max(0, min(event.block_size, len(event.token_ids) - index * event.block_size))


class KvEventState:
    """Blocks held per rank, event counts, and the stream's refusals, gaps and replays."""

    def __init__(self, max_blocks: int = MAX_BLOCKS):
        self.max_blocks = max_blocks
        self.over_block_limit = 0  # batches refused because they would pass max_blocks
        self.ranks: dict[int, RankState] = {}
        self.events: Counter[str] = Counter({"BlockStored": 0, "BlockRemoved": 0, "AllBlocksCleared": 0})
        self.batches = 0
        self.unknown_removals = 0  # BlockRemoved for a hash this stream never saw stored
        self.refused = 0
        self.refusals: deque[str] = deque(maxlen=RECENT)
        self.gaps = 0
        self.recent_gaps: deque[dict] = deque(maxlen=RECENT)
        self.gaps_unfilled = 0
        self.replays = 0
        self.replay_failures = 0
        self.replayed_batches = 0
        self.replay_refused = 0  # replay answers refused: never counted in `refused` (live frames)
        self.replay_refusals: deque[str] = deque(maxlen=RECENT)
        self.history_fetches = 0  # replays asked on (re)connect, to learn what was held before
        self.history_failures = 0
        self.history_batches = 0
        self.notices: deque[str] = deque(maxlen=RECENT)  # what a user must act on: nothing bound, ...
        self.duplicates = 0
        self.restarts = 0
        self.seq_jumps = 0  # sequence numbers too far from the last one: taken as a publisher restart
        self.disconnects = 0
        self.last_seq: dict[str, int] = {}

    def rank(self, rank: int) -> RankState:
        if rank not in self.ranks:
            self.ranks[rank] = RankState()
        return self.ranks[rank]

    def find(self, rank: int, block_hash: str, medium: str | None = None) -> BlockInfo | None:
        """The block `block_hash` held by `rank` (on `medium` first), or None."""
        return self.ranks[rank].find(block_hash, medium) if rank in self.ranks else None

    def block_count(self) -> int:
        """Blocks held, every rank and medium."""
        return sum(rank.block_count() for rank in self.ranks.values())

    def apply(self, batch: Batch, endpoint: str) -> None:
        """Apply every event of `batch`, received from `endpoint`, in order. A batch without
        a rank (early vLLM) counts as rank 0. Raises BlockLimitError, having applied nothing,
        when the batch would make the state hold more than max_blocks."""
        number = batch.dp_rank if batch.dp_rank is not None else 0
        peak = self._peak_after(self.ranks.get(number), batch)
        if peak > self.max_blocks:
            self.over_block_limit += 1
            self._note(f"batches that would make the watcher hold more than {self.max_blocks:,} blocks, its limit, "
                       "are refused (counted in over_block_limit): the blocks shown miss theirs")
            raise BlockLimitError(f"batch {batch.seq:,} would make the watcher hold {peak:,} blocks; "
                                  f"the limit is {self.max_blocks:,}")
        rank = self.rank(number)
        rank.endpoints.add(endpoint)
        for event in batch.events:
            self.events[type(event).__name__] += 1
            if isinstance(event, BlockStored):
                self._store(rank, event)
            elif isinstance(event, BlockRemoved):
                pool = rank.pool(event.medium)
                self.unknown_removals += sum(not pool.remove(h) for h in event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                rank.pools.clear()
        self.batches += 1
        self.last_seq[endpoint] = batch.seq

    def _peak_after(self, rank: RankState | None, batch: Batch) -> int:
        """The most blocks held while `batch` is applied to `rank`, counting no removal (an
        upper bound: the limit is never passed half-way through a batch)."""
        held = self.block_count()
        rank_held = rank.block_count() if rank is not None else 0
        new: set[tuple] = set()
        peak = held
        for event in batch.events:
            if isinstance(event, AllBlocksCleared):
                peak = max(peak, held + len(new))
                held, rank_held, new, rank = held - rank_held, 0, set(), None
            elif isinstance(event, BlockStored):
                new.update((event.medium, h) for h in event.block_hashes
                           if rank is None or not rank.holds(h, event.medium))
        return max(peak, held + len(new))

    def _store(self, rank: RankState, event: BlockStored) -> None:
        pool = rank.pool(event.medium)
        parent = event.parent
        for index, block_hash in enumerate(event.block_hashes):
            # The root is the parent's root (itself found by walking parents when stored),
            # or this block when the parent is unknown here.
            known = rank.find(parent, event.medium) if parent is not None else None
            root = known.root if known is not None else block_hash
            pool.store(block_hash, parent, tokens_in_block(event, index), event.lora_id, root)
            parent = block_hash

    def record_refusal(self, endpoint: str, message: str, seq: int | None = None) -> None:
        """A frame that could not be decoded; its seq (when readable) still counts as received."""
        self.refused += 1
        self.refusals.append(f"{endpoint}: {message}")
        if seq is not None:
            self.last_seq[endpoint] = seq

    def record_gap(self, endpoint: str, expected: int, got: int, filled: bool) -> None:
        """Seq `got` arrived when `expected` was due; `filled`: a replay brought every batch between."""
        self.gaps += 1
        self.gaps_unfilled += not filled
        self.recent_gaps.append({"endpoint": endpoint, "expected": expected, "got": got, "filled": filled})

    def record_replay(self, batches: int, complete: bool) -> None:
        """A replay that brought `batches` answers; complete: its end marker came in time."""
        self.replayed_batches += batches
        if complete:
            self.replays += 1
        else:
            self.replay_failures += 1

    def record_replay_refusal(self, endpoint: str, message: str, seq: int | None = None) -> None:
        """A replay answer that could not be decoded; its seq (when readable) counts as received."""
        self.replay_refused += 1
        self.replay_refusals.append(f"{endpoint}: {message}")
        if seq is not None:
            self.last_seq[endpoint] = seq

    def record_history(self, batches: int, complete: bool) -> None:
        """A history fetch on (re)connect that applied `batches`; complete: its end marker came."""
        self.history_batches += batches
        if complete:
            self.history_fetches += 1
        else:
            self.history_failures += 1

    def record_notice(self, message: str) -> None:
        """A problem a user can act on (it names the endpoint); the same one is kept once."""
        self._note(message)

    def _note(self, message: str) -> None:
        # not overridden by a locking subclass: apply() notes under that subclass's lock
        if message not in self.notices:
            self.notices.append(message)

    def record_disconnect(self, endpoint: str, message: str) -> None:
        """`endpoint`'s connection dropped; `message` says what that may mean."""
        self.disconnects += 1
        self._note(message)

    def record_seq_jump(self, endpoint: str, last: int, seq: int, how: str, outcome: str) -> None:
        """Seq `seq` came after `last` (`how`: how far, or which way): a publisher restart (or
        a lie), never a gap to wait through. `outcome` says what the watcher did about it."""
        self.seq_jumps += 1
        self._note(f"{endpoint}: sequence jumped from {last:,} to {seq:,} ({how}): taken as a publisher "
                   f"restart; {outcome}")

    def record_duplicate(self) -> None:
        """A batch whose seq was applied already (a replay brought it first)."""
        self.duplicates += 1

    def record_restart(self, endpoint: str) -> None:
        """`endpoint` began again at seq 0: the engine restarted, its counter and its cache
        with it. The blocks of ranks only this endpoint fed go (its history brings back what
        the new engine holds); a rank fed by other endpoints too keeps what they stored."""
        self.restarts += 1
        self.last_seq.pop(endpoint, None)
        for rank in self.ranks.values():
            if rank.endpoints == {endpoint}:
                rank.pools.clear()

    def summary(self) -> dict:
        """A JSON-able view: blocks per rank and medium, event counts, stream health."""
        ranks = {}
        for number in sorted(self.ranks):
            rank = self.ranks[number]
            by_medium = {NO_MEDIUM if m is None else m: len(p.blocks) for m, p in rank.pools.items() if p.blocks}
            ranks[str(number)] = {"blocks": rank.block_count(), "by_medium": dict(sorted(by_medium.items())),
                                  "endpoints": sorted(rank.endpoints)}
        return {
            "ranks": ranks,
            "events": dict(self.events),
            "batches": self.batches,
            "unknown_removals": self.unknown_removals,
            "gaps": self.gaps,
            "gaps_unfilled": self.gaps_unfilled,
            "recent_gaps": list(self.recent_gaps),
            "replays": self.replays,
            "replay_failures": self.replay_failures,
            "replayed_batches": self.replayed_batches,
            "refused": self.refused,
            "recent_refusals": list(self.refusals),
            "replay_refused": self.replay_refused,
            "recent_replay_refusals": list(self.replay_refusals),
            "history_fetches": self.history_fetches,
            "history_failures": self.history_failures,
            "history_batches": self.history_batches,
            "notices": list(self.notices),
            "duplicates": self.duplicates,
            "restarts": self.restarts,
            "seq_jumps": self.seq_jumps,
            "disconnects": self.disconnects,
            "blocks": self.block_count(),
            "block_limit": self.max_blocks,
            "over_block_limit": self.over_block_limit,
            "last_seq": dict(sorted(self.last_seq.items())),
        }
