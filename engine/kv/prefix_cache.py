"""PrefixCache: full prompt pages shared read-only between requests whose prefix is the same.

A request's full prompt pages, once written, are offered to the cache under their prefix keys
(engine/kv/prefix_keys.py: a chain over the tokens, rooted in the request's salt). A later
request whose own keys find them takes them instead of computing them: the pages leave their
writer's ownership (owner SHARED_OWNER), each holder counted in `pool.holders`, and nobody
writes them again. Their writer tags stay the original writer's and their `page_key` the key
the writer stamped: I1 in the decode kernels lets a holder read a shared page only when that
key equals the one the holder computed itself, so a cache that matched on anything less (the
salt_ignored fault: tokens only) is caught where the bytes are read.

A page nobody holds stays cached, least recently released first out: `make_room` evicts such
pages (scrubbed, as any freed page) when an allocation needs them. The cache's index is the
last reference to a page; the scrub happens when it lets go.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from engine.kv.page_pool import PageGrant, PagePool
from engine.kv.page_table import PageTable
from engine.kv.prefix_keys import TokenIds, chain_keys
from engine.wire.page_tags import NO_WRITER, SHARED_OWNER, pack_tag


@dataclass
class CacheCounts:
    lookups: int = 0  # requests that looked
    hit_pages: int = 0  # pages taken from the cache
    offered: int = 0  # pages offered by their writers
    shared: int = 0  # of those, pages that went into the cache (the rest duplicated a cached one)
    evicted: int = 0  # idle pages scrubbed and freed to make room


class PrefixCache:
    def __init__(self, pool: PagePool, *, salt_ignored: bool = False) -> None:
        self.pool = pool
        self.salt_ignored = salt_ignored  # the fault: the index matches on tokens only
        self.index: dict[int, int] = {}  # lookup key -> page
        self._index_key = np.zeros(pool.num_pages, dtype=np.int64)  # page -> its lookup key (0: none)
        self.origin_tag = np.full(pool.num_pages, NO_WRITER, dtype=np.int64)
        self._idle: OrderedDict[int, None] = OrderedDict()  # shared pages nobody holds, oldest first
        self._withdrawn: set[int] = set()  # failed I1: no new holder, scrubbed when the last one goes
        self.counts = CacheCounts()

    def __len__(self) -> int:
        return len(self.index)

    def lookup_keys(self, tokens: TokenIds, salt: str, pages: int) -> npt.NDArray[np.int64]:
        # the index's own keys; the page keys the kernels check are always salted
        return chain_keys(tokens, self.pool.page_size, "" if self.salt_ignored else salt, pages)

    # ---- taking --------------------------------------------------------------------------
    def take(self, tokens: TokenIds, salt: str, pages: int) -> npt.NDArray[np.int32]:
        """The longest run of cached pages holding the first `pages` full pages of `tokens`
        under `salt`, each now held once more."""
        self.counts.lookups += 1
        hit: list[int] = []
        if pages > 0 and self.index:
            for key in self.lookup_keys(tokens, salt, pages).tolist():
                page = self.index.get(key)
                if page is None:
                    break
                hit.append(page)
        found = np.asarray(hit, dtype=np.int32)
        self._hold(found)
        self.counts.hit_pages += len(found)
        return found

    def allocate_with_prefix(self, slot: int, tokens: TokenIds, salt: str | None, total_pages: int,
                             reusable: int, keys: npt.NDArray[np.int64]) -> PageTable:
        """A page table for request `slot`: cached pages for up to `reusable` leading pages,
        then its own grant up to `total_pages`, evicting idle pages when the pool needs them.
        All or nothing: raises PoolExhausted (taking nothing) when its own pages do not fit."""
        hit = self.take(tokens, salt, reusable) if salt is not None else np.empty(0, dtype=np.int32)
        try:
            grant = self.allocate(slot, total_pages - len(hit))
        except Exception:
            self.release_pages(hit)
            raise
        return PageTable.with_prefix(slot, self.pool.page_size, hit, self.pool.epoch[hit].copy(),
                                     self.origin_tag[hit], grant, keys)

    def allocate(self, slot: int, n: int) -> PageGrant:
        """pool.allocate after evicting idle cached pages where the free ones fall short; when
        even evicting every idle page would not do, nothing is evicted (PoolExhausted)."""
        if self.pool.free_pages + len(self._idle) >= n:
            self.make_room(n)
        return self.pool.allocate(slot, n)

    # ---- offering --------------------------------------------------------------------------
    def offer(self, table: PageTable, tokens: TokenIds, salt: str, full: int) -> int:
        """The request's own written full prompt pages (columns below `full`) go into the cache,
        except where an identical page is cached already (that one stays its own). Its table
        marks them shared; it still holds them. Returns how many went in."""
        pool, slot = self.pool, table.slot
        keys = self.lookup_keys(tokens, salt, full).tolist()
        own = np.ones(len(table.pages), dtype=bool) if table.shared is None else ~table.shared
        columns = [j for j in range(full) if own[j] and keys[j] not in self.index
                   and pool.owner[table.pages[j]] == slot]
        self.counts.offered += sum(1 for j in range(full) if own[j])
        if not columns:
            return 0
        cols = np.asarray(columns, dtype=np.int64)
        pages = table.pages[cols]
        pool.share(slot, pages)
        for j, page in zip(columns, pages.tolist()):
            self.index[keys[j]] = page
            self._index_key[page] = keys[j]
        self.origin_tag[pages] = pack_tag(np.int64(slot), table.epochs[cols])
        table.mark_shared(cols)
        self.counts.shared += len(columns)
        return len(columns)

    # ---- letting go --------------------------------------------------------------------------
    def release(self, table: PageTable) -> npt.NDArray[np.int32]:
        """The request is done: its shared pages lose a holder (one nobody holds becomes
        evictable), its own pages are freed. Returns the own pages it did not own (stray)."""
        self.release_pages(table.shared_pages())
        return self.pool.release(table.slot, table.own_pages())

    def release_pages(self, pages: npt.NDArray[np.int32]) -> None:
        pool = self.pool
        for page in pages.tolist():
            if pool.owner[page] != SHARED_OWNER or pool.holders[page] <= 0:
                continue  # not a held shared page (a corrupt table): nothing of it to give back
            pool.holders[page] -= 1
            if pool.holders[page] == 0 and page in self._withdrawn:
                self._withdrawn.discard(page)
                pool.free_shared([page])
            elif pool.holders[page] == 0:
                self._idle[page] = None
                self._idle.move_to_end(page)
        pool.mark_dirty(pages)
        pool.evictable_pages = len(self._idle)

    def withdraw(self, pages: npt.NDArray[np.integer[Any]] | list[int]) -> list[int]:
        """Shared pages a reader found failing I1 leave the index: nobody new takes them, and
        their bytes stay as evidence until the last holder lets go, then are scrubbed.
        Returns those of `pages` that were shared."""
        pool, out = self.pool, []
        for page in (int(p) for p in pages):
            if not 0 <= page < pool.num_pages or pool.owner[page] != SHARED_OWNER:
                continue
            key = int(self._index_key[page])
            if self.index.get(key) == page:
                del self.index[key]
            self._index_key[page] = 0
            self._idle.pop(page, None)
            out.append(page)
            if pool.holders[page] == 0:
                pool.free_shared([page])
            else:
                self._withdrawn.add(page)
        pool.evictable_pages = len(self._idle)
        return out

    def make_room(self, n: int) -> int:
        """Evict idle cached pages, least recently released first, until `n` pages are free
        (or none is idle). Returns how many were evicted."""
        pool, evicted = self.pool, list[int]()
        while pool.free_pages + len(evicted) < n and self._idle:
            page, _ = self._idle.popitem(last=False)
            del self.index[int(self._index_key[page])]
            self._index_key[page] = 0
            self.origin_tag[page] = NO_WRITER
            evicted.append(page)
        if evicted:
            pool.free_shared(evicted)
            self.counts.evicted += len(evicted)
        pool.evictable_pages = len(self._idle)
        return len(evicted)

    def clear(self) -> int:
        """Evict every idle page (the scope changed, or the cache is turned off)."""
        return self.make_room(self.pool.num_pages)

    def _hold(self, pages: npt.NDArray[np.int32]) -> None:
        if not len(pages):
            return
        self.pool.holders[pages] += 1
        for page in pages.tolist():
            self._idle.pop(page, None)
        self.pool.mark_dirty(pages)
        self.pool.evictable_pages = len(self._idle)
