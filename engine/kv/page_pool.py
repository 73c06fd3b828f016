"""PagePool: fixed-size KV pages for all layers, plus who owns and who wrote each page.

Storage is page-major, `data[page, layer, k|v, token, kv_head, dim]`, so one page's bytes
(every layer) are one contiguous block: a transfer sends it as one frame and a scrub
clears it with one fill.

Where the metadata lives: `token_writer` (the writer tag of every token slot, which I1
checks), `writer` (each page's last writer) and `filled` (slots written this epoch) are
device tensors, because only the code that writes K/V may set them and the attention kernel
checks them. `owner`, `epoch` and `state` are host arrays kept by the allocator, which needs
them on every allocate/free without a device round trip.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
import torch

from engine.errors import ConfigError, IsolationError, PoolExhausted
from engine.wire.page_tags import FREE_OWNER, NO_WRITER, SHARED_OWNER, PageState

SCRUB_VALUES = {"zero": 0.0, "poison": float("nan")}
MAX_SLOT = (1 << 31) - 1

# page numbers as callers hold them: a grant's int32 array, an int64 index, or a plain list
PageIds: TypeAlias = npt.NDArray[np.integer[Any]] | Sequence[int]
# fills whole pages of the pool tensor with a value (kernels.scrub_pages); its result is unused
ScrubFn: TypeAlias = Callable[[torch.Tensor, torch.Tensor, float], object]
# one metadata array per name (metadata_snapshot): owner and filled int32, epoch and writer
# int64, state uint8
MetadataArrays: TypeAlias = dict[str, npt.NDArray[np.int32] | npt.NDArray[np.int64] | npt.NDArray[np.uint8]]


@dataclass(frozen=True)
class PageLayout:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    dtype: torch.dtype

    @property
    def page_shape(self) -> tuple[int, ...]:
        return (self.num_layers, 2, self.page_size, self.num_kv_heads, self.head_dim)

    @property
    def bytes_per_page(self) -> int:
        return int(np.prod(self.page_shape)) * torch.empty(0, dtype=self.dtype).element_size()


@dataclass(frozen=True)
class PageGrant:
    """Pages handed to one owner by one allocate() call, with the epoch of each."""

    pages: npt.NDArray[np.int32]
    epochs: npt.NDArray[np.int64]


class PagePool:
    def __init__(
        self,
        name: str,
        num_pages: int,
        layout: PageLayout,
        *,
        device: torch.device | str = "cpu",
        scrub_policy: str = "zero",
        scrub_fn: ScrubFn | None = None,
        provenance: bool = False,
    ) -> None:
        """scrub_fn(data, pages_tensor, value) fills whole pages (kernels.scrub_pages).
        provenance: keep, beside the data, which request slot's content sits in each token
        slot (-1: nothing, or scrubbed) — the ground truth of what a read really received."""
        if num_pages < 1:
            raise ConfigError(f"pool {name!r}: pages = {num_pages} must be at least 1")
        if scrub_policy not in (*SCRUB_VALUES, "none"):
            raise ConfigError(
                f"pool {name!r}: scrub policy {scrub_policy!r} is not one of zero, poison, none"
            )
        self.name = name
        self.num_pages = num_pages
        self.layout = layout
        self.device = torch.device(device)
        self.scrub_policy = scrub_policy
        self._scrub_fn: ScrubFn = scrub_fn or _scrub_with_index_fill
        self.data = torch.zeros((num_pages, *layout.page_shape), dtype=layout.dtype, device=self.device)
        self.writer = torch.full((num_pages,), NO_WRITER, dtype=torch.int64, device=self.device)
        # I1's evidence: who wrote each token slot, stamped by every write (store kernels, the
        # transfer receiver) and reset by every scrub, so it names the same writer as the
        # content it sits beside
        self.token_writer = torch.full((num_pages, layout.page_size), NO_WRITER, dtype=torch.int64,
                                       device=self.device)
        self.filled = torch.zeros(num_pages, dtype=torch.int32, device=self.device)
        # each page's prefix key: the chain hash (parent, tokens, salt) of the prompt content it
        # holds, stamped by the code that wrote it for a full prompt page, 0 otherwise; the
        # decode kernels let a reader attend a page only when it computed the same key itself
        self.page_key = torch.zeros(num_pages, dtype=torch.int64, device=self.device)
        # how many requests hold each shared page (owner SHARED_OWNER); 0 for every other page
        self.holders: npt.NDArray[np.int32] = np.zeros(num_pages, dtype=np.int32)
        # per-layer strided views, made once: every decode step asks for them per layer
        self._k_views = [self.data[:, layer, 0] for layer in range(layout.num_layers)]
        self._v_views = [self.data[:, layer, 1] for layer in range(layout.num_layers)]
        self.owner: npt.NDArray[np.int32] = np.full(num_pages, FREE_OWNER, dtype=np.int32)
        self.epoch: npt.NDArray[np.int64] = np.zeros(num_pages, dtype=np.int64)
        self.state: npt.NDArray[np.uint8] = np.zeros(num_pages, dtype=np.uint8)
        # Free pages as a stack: allocate pops a slice, free pushes one; O(1) per page.
        self._free_stack: npt.NDArray[np.int32] = np.arange(num_pages - 1, -1, -1, dtype=np.int32)
        self._free_top = num_pages
        self.scrubbed_pages = 0
        self.scrub_enabled = True  # the I5 defence switch (and the skip_scrub fault) turn it off
        self.quarantine_s = 30.0  # how long violated pages stay visible before their scrub
        self._quarantine: list[tuple[float, int, npt.NDArray[np.int64]]] = []
        self.provenance: npt.NDArray[np.int32] | None = (
            np.full((num_pages, layout.page_size), -1, dtype=np.int32) if provenance else None)
        # beside it, the identity of the prefix each token slot's content belongs to (prefix_keys.
        # content_identities), 0 for content no other request may share (decoded tokens, a
        # prompt's last partial page)
        self.identity: npt.NDArray[np.int64] | None = (
            np.zeros((num_pages, layout.page_size), dtype=np.int64) if provenance else None)
        # Pages whose metadata changed since the last take_dirty(), for telemetry deltas.
        # Off unless someone watches: then every metadata change appends its pages here.
        self.track_dirty = False
        self._dirty: list[npt.NDArray[np.int32]] = []

    # ---- capacity -----------------------------------------------------------------
    @property
    def page_size(self) -> int:
        return self.layout.page_size

    @property
    def capacity_tokens(self) -> int:
        return self.num_pages * self.layout.page_size

    @property
    def free_pages(self) -> int:
        return self._free_top

    @property
    def used_pages(self) -> int:
        return self.num_pages - self._free_top

    @property
    def available_pages(self) -> int:
        """Free pages plus the cached pages nobody holds, which an allocation may evict."""
        return self._free_top + self.evictable_pages

    evictable_pages = 0  # kept by the prefix cache, when there is one

    def peek_free(self) -> int:
        """The page the next allocate() hands out first (fault injection uses it)."""
        if not self._free_top:
            raise PoolExhausted(f"pool {self.name!r} has no free page")
        return int(self._free_stack[self._free_top - 1])

    def pages_for_tokens(self, tokens: int) -> int:
        return -(-tokens // self.layout.page_size)

    # ---- allocation ---------------------------------------------------------------
    def allocate(self, slot: int, n: int) -> PageGrant:
        """Give `n` free pages to request `slot`, all or nothing.

        Raises PoolExhausted (naming pool, asked and free) when fewer than n are free.
        """
        _check_slot(slot)
        if n < 0:
            raise ValueError(f"pool {self.name!r}: cannot allocate {n} pages")
        if n > self._free_top:
            raise PoolExhausted(
                f"pool {self.name!r} has {self._free_top:,} free pages of {self.num_pages:,}; "
                f"request slot {slot} asked for {n:,}"
            )
        top = self._free_top
        pages = self._free_stack[top - n : top][::-1].copy()
        self._free_top = top - n
        self.epoch[pages] += 1
        self.owner[pages] = slot
        self.state[pages] = PageState.RESERVED
        if n:
            # Nothing of this epoch is written yet; the token tags keep the previous writers
            # (their content is still there unless scrubbed) and can never match the new epoch.
            index = self._index(pages)
            self.filled[index] = 0
            self.page_key[index] = 0
            self.mark_dirty(pages)
        return PageGrant(pages, self.epoch[pages].copy())

    def free(self, slot: int, pages: PageIds) -> None:
        """Return `slot`'s pages, scrubbed per policy.

        Raises IsolationError, changing nothing, when a page is out of range, listed twice,
        free already, or owned by another slot.
        """
        self._push_free(self._validated(slot, pages, "free"))

    def share(self, slot: int, pages: PageIds) -> None:
        """`slot`'s written pages go to the prefix cache: owner SHARED_OWNER, held by `slot`
        alone until others take them (holders 1). Their tags, keys and bytes stay."""
        pages = self._validated(slot, pages, "share")
        self.owner[pages] = SHARED_OWNER
        self.holders[pages] = 1
        self.state[pages] = PageState.WRITTEN
        self.mark_dirty(pages)

    def free_shared(self, pages: PageIds) -> None:
        """The prefix cache lets go of pages nobody holds: scrubbed per policy and freed.
        Raises IsolationError, changing nothing, for a page that is not shared or still held."""
        ids = np.asarray(pages, dtype=np.int64).reshape(-1)
        bad = ids[(ids < 0) | (ids >= self.num_pages)]
        if len(bad):
            raise IsolationError(f"pool {self.name!r} has no page {int(bad[0])} to free from the prefix cache")
        wrong = ids[(self.owner[ids] != SHARED_OWNER) | (self.holders[ids] != 0)]
        if len(wrong):
            page = int(wrong[0])
            raise IsolationError(f"page {page} of pool {self.name!r} cannot leave the prefix cache: owner "
                                 f"{int(self.owner[page])}, {int(self.holders[page])} holder(s)")
        freed: npt.NDArray[np.int32] = ids.astype(np.int32)
        if len(freed):
            self.page_key[self._index(freed)] = 0
        self._push_free(freed)

    def _push_free(self, pages: npt.NDArray[np.int32]) -> None:
        """Scrub checked pages per policy and put them back on the free stack."""
        if not len(pages):
            return
        self._scrub(pages)
        self.owner[pages] = FREE_OWNER
        self.state[pages] = PageState.FREE
        top = self._free_top
        self._free_stack[top : top + len(pages)] = pages[::-1]
        self._free_top = top + len(pages)
        self.mark_dirty(pages)

    def release(self, slot: int, pages: PageIds, now: float | None = None) -> npt.NDArray[np.int32]:
        """Free those of `pages` that `slot` still owns; return the ones it does not (a page
        table that went stale must not crash the worker, and must be reported). QUARANTINED
        pages are held as evidence for `quarantine_s` seconds, then scrubbed and freed."""
        ids: npt.NDArray[np.int64] = np.asarray(pages, dtype=np.int64).reshape(-1)
        ids = ids[(ids >= 0) & (ids < self.num_pages)]
        ids = np.unique(ids)
        mine: npt.NDArray[np.bool_] = self.owner[ids] == slot  # numpy's stubs type == as Any
        held = mine & (self.state[ids] == PageState.QUARANTINED)
        if held.any():
            now = time.monotonic() if now is None else now
            self._quarantine.append((now + self.quarantine_s, slot, ids[held]))
        self.free(slot, ids[mine & ~held])
        return ids[~mine].astype(np.int32)

    def release_quarantine(self, now: float | None = None) -> int:
        """Scrub and free quarantined pages whose hold has run out; returns how many."""
        now = time.monotonic() if now is None else now
        due = [q for q in self._quarantine if q[0] <= now]
        if not due:
            return 0
        self._quarantine = [q for q in self._quarantine if q[0] > now]
        for _, slot, pages in due:
            self.free(slot, pages[self.owner[pages] == slot])
        return sum(len(p) for _, _, p in due)

    def record_content(self, flat_slots: npt.NDArray[np.integer[Any]],
                       writer_slots: npt.NDArray[np.integer[Any]],
                       identities: npt.NDArray[np.int64] | int = 0) -> None:
        """Provenance: the token slots (page * page_size + offset) now hold `writer_slots`' data,
        of the prefix `identities` (0: content of no shared prefix)."""
        if self.provenance is not None and self.identity is not None and len(flat_slots):
            flat = np.asarray(flat_slots, dtype=np.int64)
            self.provenance.reshape(-1)[flat] = writer_slots
            self.identity.reshape(-1)[flat] = identities

    def set_state(self, slot: int, pages: PageIds, state: PageState) -> None:
        """Move `slot`'s own pages to RESERVED / IN_FLIGHT / WRITTEN / QUARANTINED."""
        if state == PageState.FREE:
            raise ValueError("use free() to release pages")
        pages = self._validated(slot, pages, f"mark {state.name}")
        self.state[pages] = state
        self.mark_dirty(pages)

    # ---- telemetry --------------------------------------------------------------------
    def mark_dirty(self, pages: PageIds) -> None:
        """Note pages whose metadata changed (the kernels' writers call this for their pages)."""
        if self.track_dirty:
            self._dirty.append(np.asarray(pages, dtype=np.int32).reshape(-1))

    def take_dirty(self) -> npt.NDArray[np.int32]:
        """Sorted unique pages changed since the last call; clears the record."""
        if not self._dirty:
            return np.empty(0, dtype=np.int32)
        dirty = np.unique(np.concatenate(self._dirty))
        self._dirty.clear()
        return dirty

    # ---- views for kernels -----------------------------------------------------------
    def k_cache(self, layer: int) -> torch.Tensor:
        """[num_pages, page_size, kv_heads, head_dim] view of one layer's K (not contiguous)."""
        return self._k_views[layer]

    def v_cache(self, layer: int) -> torch.Tensor:
        return self._v_views[layer]

    def metadata_snapshot(self) -> MetadataArrays:
        """Copies of all five metadata arrays on the host (telemetry, snapshots, tests)."""
        return {
            "owner": self.owner.copy(),
            "epoch": self.epoch.copy(),
            "writer": self.writer.cpu().numpy().copy(),
            "filled": self.filled.cpu().numpy().copy(),
            "state": self.state.copy(),
            "refs": self.refs(),
        }

    def refs(self, index: npt.NDArray[np.int32] | None = None) -> npt.NDArray[np.int32]:
        """How many requests hold each page (all, or `index`), as the wire's optional `refs`
        carries it: the count for a shared page, 1 for a page a request owns, 0 when free."""
        owner = self.owner if index is None else self.owner[index]
        state = self.state if index is None else self.state[index]
        holders = self.holders if index is None else self.holders[index]
        return np.where(owner == SHARED_OWNER, holders, (state != PageState.FREE).astype(np.int32)).astype(np.int32)

    # ---- internals -------------------------------------------------------------------
    def _index(self, pages: npt.NDArray[np.int32]) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(pages, dtype=np.int64)).to(self.device)

    def _validated(self, slot: int, pages: PageIds, action: str) -> npt.NDArray[np.int32]:
        _check_slot(slot)
        pages = np.asarray(pages, dtype=np.int64).reshape(-1)
        bad = pages[(pages < 0) | (pages >= self.num_pages)]
        if len(bad):
            raise IsolationError(
                f"slot {slot} cannot {action} page {int(bad[0])}: pool {self.name!r} "
                f"has pages 0..{self.num_pages - 1}"
            )
        unique, counts = np.unique(pages, return_counts=True)
        if len(unique) != len(pages):
            raise IsolationError(
                f"slot {slot} cannot {action} page {int(unique[counts > 1][0])} of pool "
                f"{self.name!r}: it is listed twice"
            )
        owners = self.owner[pages]
        wrong = np.nonzero(owners != slot)[0]
        if len(wrong):
            page, holder = int(pages[wrong[0]]), int(owners[wrong[0]])
            why = "it is already free" if holder == FREE_OWNER else f"it is owned by slot {holder}"
            raise IsolationError(f"slot {slot} cannot {action} page {page} of pool {self.name!r}: {why}")
        return pages.astype(np.int32)

    def _scrub(self, pages: npt.NDArray[np.int32]) -> None:
        quarantined = self.state[pages] == PageState.QUARANTINED
        policy = self.scrub_policy
        if not self.scrub_enabled:
            policy = "none"
        if policy == "none":
            # Measuring the cost of not scrubbing is allowed; leaving violated pages is not.
            pages = pages[quarantined]
            policy = "zero"
        if len(pages):
            index = self._index(pages)
            self._scrub_fn(self.data, index, SCRUB_VALUES[policy])
            self.token_writer.index_fill_(0, index, NO_WRITER)  # nothing written since the scrub
            self.scrubbed_pages += len(pages)
            if self.provenance is not None and self.identity is not None:
                self.provenance[pages] = -1
                self.identity[pages] = 0


def _check_slot(slot: int) -> None:
    if not 0 <= slot <= MAX_SLOT:
        raise ValueError(f"slot {slot} is outside 0..{MAX_SLOT}")


def _scrub_with_index_fill(data: torch.Tensor, pages: torch.Tensor, value: float) -> None:
    data.index_fill_(0, pages, value)
