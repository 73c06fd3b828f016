"""PageGrid (where each page sits on screen) and PoolImage (a pool's uint8 index image).

Pages go row-major into a grid about as wide as it is tall (the width a multiple of 8);
cells past the last page are NO_PAGE padding. PoolImage follows one pool of a PageMirror
and recomputes only the pages that changed: the pool's `take_changes()` (every page the
messages since the last update touched, however many), everything for a new pool or after
a mode change. `shared_overlay` draws the marker of pages held by more than one request (an
RGBA image laid over a pool's index image: a white stripe edged in black across each such
cell, visible on every colour and in every mode).

Qt-free: numpy only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from engine.client import PoolMirror
from engine.wire.page_tags import SHARED_OWNER
from gui.model.page_colors import FREE_PAGE, NO_PAGE, QUARANTINED_PAGE, PageColors

GRID_ALIGN = 8
SHARED_SUB_MAX = 8  # pixels per cell side of the shared-page overlay (fewer for big pools)
SHARED_IMAGE_SIDE = 1024  # the overlay image's longer side stays within this
SHARED_STRIPE = (255, 255, 255, 255)  # the stripe across a shared page's cell...
SHARED_EDGE = (0, 0, 0, 255)  # ...and its edges


@dataclass(frozen=True)
class PageGrid:
    num_pages: int
    cols: int
    rows: int

    @classmethod
    def for_pages(cls, num_pages: int) -> "PageGrid":
        """The grid for num_pages: cols = ceil(sqrt(n)) rounded up to a multiple of 8."""
        if num_pages < 0:
            raise ValueError(f"a pool cannot have {num_pages} pages")
        cols = max(GRID_ALIGN, -(-math.ceil(math.sqrt(num_pages)) // GRID_ALIGN) * GRID_ALIGN)
        rows = max(1, -(-num_pages // cols))
        return cls(num_pages, cols, rows)

    def cell_of(self, page: int) -> tuple[int, int]:
        """page -> (row, col); raises IndexError outside the pool."""
        if not 0 <= page < self.num_pages:
            raise IndexError(f"page {page} is outside 0..{self.num_pages - 1}")
        return divmod(page, self.cols)

    def page_of(self, row: int, col: int) -> int | None:
        """(row, col) -> page, or None for padding and cells outside the grid."""
        if not (0 <= row < self.rows and 0 <= col < self.cols):
            return None
        page = row * self.cols + col
        return page if page < self.num_pages else None

    def page_at(self, x: float, y: float) -> int | None:
        """Image coordinates (x right, y down; cell (r, c) covers [c, c+1) x [r, r+1)) -> page."""
        if not (math.isfinite(x) and math.isfinite(y)):
            return None
        return self.page_of(math.floor(y), math.floor(x))

    def cell_center(self, page: int) -> tuple[float, float]:
        """(x, y) image coordinates of the middle of a page's cell."""
        row, col = self.cell_of(page)
        return col + 0.5, row + 0.5


def shared_sub(grid: PageGrid) -> int:
    """Overlay pixels per cell side for a grid: SHARED_SUB_MAX, fewer (at least 2) for big pools."""
    return max(2, min(SHARED_SUB_MAX, SHARED_IMAGE_SIDE // max(grid.rows, grid.cols)))


def shared_cell(sub: int) -> np.ndarray:
    """(sub, sub, 4) uint8 RGBA: one cell's marker, a stripe from the bottom-left corner to the
    top-right one (edged on both sides), transparent elsewhere."""
    i, j = np.indices((sub, sub))
    diagonal = i + j - (sub - 1)  # 0 on the stripe, +-1 beside it
    cell = np.zeros((sub, sub, 4), dtype=np.uint8)
    cell[np.abs(diagonal) == 1] = SHARED_EDGE
    cell[diagonal == 0] = SHARED_STRIPE
    return cell


def shared_overlay(grid: PageGrid, pages: np.ndarray) -> np.ndarray:
    """(rows * sub, cols * sub, 4) uint8 RGBA over a pool's grid: the marker in the cell of each
    page in `pages`, transparent elsewhere (sub = shared_sub(grid); the image covers the same
    rect as the index image, cell (r, c) at pixels [r*sub, (r+1)*sub) x [c*sub, (c+1)*sub))."""
    sub = shared_sub(grid)
    mask = np.zeros(grid.rows * grid.cols, dtype=np.uint8)
    pages = np.asarray(pages, dtype=np.intp)
    mask[pages[(pages >= 0) & (pages < grid.num_pages)]] = 1
    mask = mask.reshape(grid.rows, 1, grid.cols, 1, 1)
    image = mask * shared_cell(sub)[None, :, None, :, :]
    return image.reshape(grid.rows * sub, grid.cols * sub, 4)


def shared_cells_of(grid: PageGrid, overlay: np.ndarray) -> np.ndarray:
    """The pages (int64, ascending) whose cell an overlay marks: the inverse of shared_overlay."""
    sub = overlay.shape[0] // grid.rows
    marked = overlay[..., 3].reshape(grid.rows, sub, grid.cols, sub).any(axis=(1, 3)).reshape(-1)
    return np.flatnonzero(marked[:grid.num_pages])


class PoolImage:
    """The index image of one pool: `image` is (rows, cols) uint8 for the current colour mode.

    `counts` holds pages per index of the request-mode image; its colour counts feed the
    shared PageColors so that colours are recycled across pools.
    """

    def __init__(self, colors: PageColors):
        self.colors = colors
        self.grid = PageGrid.for_pages(0)
        self.owner_image = np.zeros((1, GRID_ALIGN), dtype=np.uint8)  # request mode, always kept
        self._display: np.ndarray | None = None  # tenant/state mode; None in request mode
        self.counts = np.zeros(256, dtype=np.int64)
        self._pool: PoolMirror | None = None
        self._generation = -1
        self.last_update_pages = 0  # pages recomputed by the last update (for tests and benches)

    @property
    def image(self) -> np.ndarray:
        return self.owner_image if self._display is None else self._display

    @property
    def used_pages(self) -> int:
        return self.grid.num_pages - int(self.counts[FREE_PAGE])

    @property
    def quarantined_pages(self) -> int:
        return int(self.counts[QUARANTINED_PAGE])

    def update(self, pool: PoolMirror) -> bool:
        """Bring the image up to the pool's metadata; True if any cell may have changed."""
        generation_changed = self._generation != self.colors.generation
        index = pool.take_changes()  # the pages touched since the last update (None: all)
        if pool is not self._pool or pool.num_pages != self.grid.num_pages:
            self._resize(pool.num_pages)  # a new pool object: nothing drawn belongs to it
            index = None
        self._pool = pool
        if index is not None:
            index = index.astype(np.intp)  # numpy gathers and scatters with intp 2-3x faster
        if index is None:
            self._recompute_owner_image(pool, np.arange(pool.num_pages))
        elif len(index):
            self._recompute_owner_image(pool, index)
        else:
            self.last_update_pages = 0
        if self.colors.mode == "request":
            self._display = None
        elif generation_changed or self._display is None or index is None:
            self._display = np.full_like(self.owner_image, NO_PAGE)
            self._recompute_display(pool, slice(None))
            self.last_update_pages = pool.num_pages
        elif len(index):
            self._recompute_display(pool, index)
        self._generation = self.colors.generation
        return generation_changed or index is None or len(index) > 0

    def detach(self) -> None:
        """Give this pool's colour counts back (the pool is gone)."""
        self.colors.owners.count(-self.counts)
        self.counts[:] = 0

    def _resize(self, num_pages: int) -> None:
        self.detach()
        self.grid = PageGrid.for_pages(num_pages)
        self.owner_image = np.full((self.grid.rows, self.grid.cols), NO_PAGE, dtype=np.uint8)
        self.counts[NO_PAGE] = self.owner_image.size
        self._display = None

    def _recompute_owner_image(self, pool: PoolMirror, index: np.ndarray) -> None:
        owner, state = colour_owner(pool, index), pool.arrays["state"][index]
        flat = self.owner_image.reshape(-1)
        new = self.colors.owner_indices(owner, state)
        delta = np.bincount(new, minlength=256) - np.bincount(flat[index], minlength=256)
        flat[index] = new
        self.counts += delta
        self.colors.owners.count(delta)
        self.last_update_pages = len(new)

    def _recompute_display(self, pool: PoolMirror, index) -> None:
        owner, state = colour_owner(pool, index), pool.arrays["state"][index]
        flat = self._display.reshape(-1)
        if isinstance(index, slice):
            flat[:pool.num_pages] = self.colors.display_indices(owner, state)
        else:
            flat[index] = self.colors.display_indices(owner, state)


def colour_owner(pool: PoolMirror, index) -> np.ndarray:
    """The request slot each page is coloured by: its owner, or for a page the prefix cache
    shares (owner SHARED_OWNER) the request that wrote it, whose salt (tenant) it carries."""
    owner = pool.arrays["owner"][index]
    shared = owner == SHARED_OWNER
    if not shared.any():
        return owner
    writer_slot = (pool.arrays["writer"][index] >> 32).astype(owner.dtype)
    return np.where(shared, writer_slot, owner)
