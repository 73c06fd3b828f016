"""PageTable: one request's pages in one pool, in token order, and the tags it expects.

The table remembers the epoch at which each page was granted, so the reader's expected
writer tag for a page is (its own slot, that epoch): a page freed and handed to someone
else has a new epoch and can never match.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import numpy.typing as npt

from engine.wire.page_tags import pack_tag

if TYPE_CHECKING:  # the supervisor uses page tables' neighbours without importing torch
    from engine.kv.page_pool import PageGrant

# token positions as callers hold them: an integer array of any width, or a plain list
Positions: TypeAlias = npt.NDArray[np.integer[Any]] | Sequence[int]


@dataclass
class PageTable:
    slot: int
    page_size: int
    pages: npt.NDArray[np.int32]  # token t lives in pages[t // page_size]
    epochs: npt.NDArray[np.int64]  # epoch of each page at grant time
    # pages held through the prefix cache, not owned: True where so. Their expected tag is the
    # writer tag they carry from their original writer (`origin_tags`), never this request's.
    shared: npt.NDArray[np.bool_] | None = None
    origin_tags: npt.NDArray[np.int64] | None = None
    # the prefix key this request computed for each page from its own tokens and salt (0: a
    # page that holds no keyed prefix); None: no page is keyed
    keys: npt.NDArray[np.int64] | None = None
    # the provenance audit's identity of the content each page should hold (prefix_keys.
    # content_identities; 0: none): a read of another request's content is not a crossing
    # when that content's identity is this one. None: nothing is shared
    truth: npt.NDArray[np.int64] | None = None

    @classmethod
    def from_grant(cls, slot: int, page_size: int, grant: "PageGrant") -> "PageTable":
        return cls(slot, page_size, grant.pages.copy(), grant.epochs.copy())

    @classmethod
    def with_prefix(cls, slot: int, page_size: int, hit_pages: npt.NDArray[np.int32],
                    hit_epochs: npt.NDArray[np.int64], origin_tags: npt.NDArray[np.int64],
                    grant: "PageGrant", keys: npt.NDArray[np.int64]) -> "PageTable":
        """Pages taken from the prefix cache first, then the request's own grant; `keys` are
        its own prefix keys for its leading full pages (the rest are 0)."""
        n_hit, n = len(hit_pages), len(hit_pages) + len(grant.pages)
        shared = np.zeros(n, dtype=bool)
        shared[:n_hit] = True
        tags = np.full(n, -1, dtype=np.int64)
        tags[:n_hit] = origin_tags
        all_keys = np.zeros(n, dtype=np.int64)
        all_keys[: min(n, len(keys))] = keys[:n]
        return cls(slot, page_size, np.concatenate([hit_pages, grant.pages]).astype(np.int32),
                   np.concatenate([hit_epochs, grant.epochs]).astype(np.int64), shared, tags, all_keys)

    @property
    def capacity_tokens(self) -> int:
        return len(self.pages) * self.page_size

    def own_pages(self) -> npt.NDArray[np.int32]:
        return self.pages if self.shared is None else self.pages[~self.shared]

    def shared_pages(self) -> npt.NDArray[np.int32]:
        return self.pages[:0] if self.shared is None else self.pages[self.shared]

    def expected_tags(self) -> npt.NDArray[np.int64]:
        tags = pack_tag(np.int64(self.slot), self.epochs)
        if self.shared is not None and self.origin_tags is not None:
            tags = np.where(self.shared, self.origin_tags, tags)
        return tags

    def expected_keys(self) -> npt.NDArray[np.int64]:
        return np.zeros(len(self.pages), dtype=np.int64) if self.keys is None else self.keys

    def mark_shared(self, columns: npt.NDArray[np.integer[Any]]) -> None:
        """Its own pages at `columns` went to the prefix cache (it still holds them)."""
        if self.shared is None:
            self.shared = np.zeros(len(self.pages), dtype=bool)
            self.origin_tags = np.full(len(self.pages), -1, dtype=np.int64)
        assert self.origin_tags is not None
        self.origin_tags[columns] = pack_tag(np.int64(self.slot), self.epochs[columns])
        self.shared[columns] = True

    def slot_mapping(self, positions: Positions) -> npt.NDArray[np.int64]:
        """Token positions -> flat pool slots (page * page_size + offset), int64."""
        positions = np.asarray(positions, dtype=np.int64)
        if len(positions) and positions.max() >= self.capacity_tokens:
            raise IndexError(
                f"slot {self.slot}: position {int(positions.max())} is past its "
                f"{self.capacity_tokens} reserved tokens"
            )
        pages = self.pages[positions // self.page_size].astype(np.int64)
        return pages * self.page_size + positions % self.page_size

    def tags_for(self, positions: Positions) -> npt.NDArray[np.int64]:
        """Writer tag to stamp on each written position (the page's expected tag)."""
        positions = np.asarray(positions, dtype=np.int64)
        return pack_tag(np.int64(self.slot), self.epochs[positions // self.page_size])


def block_tables(tables: list[PageTable], min_width: int = 1) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int64]]:
    """Stack page tables into [B, P] page ids (int32) and expected tags (int64).

    Padding entries point at page 0 with tag -1; kernels never read past seq_len.
    """
    width = max([min_width, *(len(t.pages) for t in tables)])
    pages = np.zeros((len(tables), width), dtype=np.int32)
    tags = np.full((len(tables), width), -1, dtype=np.int64)
    for row, table in enumerate(tables):
        n = len(table.pages)
        pages[row, :n] = table.pages
        tags[row, :n] = table.expected_tags()
    return pages, tags


def block_keys(tables: list[PageTable], width: int) -> npt.NDArray[np.int64]:
    """[B, width] prefix keys each table expects per page column (padding 0)."""
    keys = np.zeros((len(tables), width), dtype=np.int64)
    for row, table in enumerate(tables):
        if table.keys is not None:
            keys[row, : len(table.keys)] = table.keys
    return keys
