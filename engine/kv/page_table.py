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

    @classmethod
    def from_grant(cls, slot: int, page_size: int, grant: "PageGrant") -> "PageTable":
        return cls(slot, page_size, grant.pages.copy(), grant.epochs.copy())

    @property
    def capacity_tokens(self) -> int:
        return len(self.pages) * self.page_size

    def expected_tags(self) -> npt.NDArray[np.int64]:
        return pack_tag(np.int64(self.slot), self.epochs)

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
