"""render_pagemap_png(): one pool's page map as a PNG, with the app's palette and a legend.

Qt-free (numpy + Pillow), so the CLI exports without a display and the GUI exports off its
main thread. The colours are the app's: gui.model.page_colors in request mode, dark theme.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from gui.model.page_colors import (
    BRIGHT_BASE,
    CANARY_PAGE,
    DIM_BASE,
    FREE_PAGE,
    NO_PAGE,
    NUM_COLOURS,
    QUARANTINED_PAGE,
    PageColors,
)
from gui.model.page_grid import PageGrid

MAX_SIDE = 1024  # pixels of the map itself (cells are scaled up to about this)
MARGIN = 16
LEGEND_OWNERS = 12  # the requests holding the most pages get a swatch each
DOT = (255, 255, 255)  # marks a page whose data crossed (first-crossing maps)


def _font(size: int):
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1 has one bitmap size
        return ImageFont.load_default()


def render_pagemap_png(pool: dict, arrays: dict[str, np.ndarray], requests: list[dict], *,
                       when: str = "", crossed: np.ndarray | None = None) -> bytes:
    """pool: {"name", "role", "pages", "page_size"}; arrays: owner, state (...); requests:
    state.json requests (slot -> request id and tenant, for colours and the legend). `when`
    goes into the title ("at the first crossing, <time>"); `crossed` (a mask per page) puts a
    white dot on the pages whose data crossed."""
    owner = np.asarray(arrays["owner"], dtype=np.int32)
    state = np.asarray(arrays["state"], dtype=np.uint8)
    by_slot = {int(r["slot"]): r for r in requests if isinstance(r, dict) and isinstance(r.get("slot"), int)}
    colors = PageColors("dark", lambda slot: (by_slot.get(int(slot)) or {}).get("tenant"))
    index = colors.display_indices(owner, state)
    lut = colors.lut()
    grid = PageGrid.for_pages(len(owner))
    cells = np.full(grid.rows * grid.cols, NO_PAGE, dtype=np.uint8)
    cells[: len(index)] = index
    rgb = lut[cells.reshape(grid.rows, grid.cols), :3]
    scale = max(1, MAX_SIDE // max(grid.cols, grid.rows))
    page_map = Image.fromarray(np.ascontiguousarray(rgb), "RGB").resize(
        (grid.cols * scale, grid.rows * scale), Image.NEAREST)
    marked = _mark(page_map, grid.cols, scale, crossed)

    swatches = _legend(colors, lut, owner, state, by_slot)
    if marked:
        swatches.insert(0, (DOT, "white dot: a page one request owns and another last wrote"))
    # large type: the report shows two maps side by side, each at about half its width
    font, small = _font(24), _font(19)
    line = 28
    width = max(page_map.width + 2 * MARGIN, 720)
    heads = 3 if when else 2
    height = MARGIN + heads * line + 4 + page_map.height + MARGIN + len(swatches) * line + MARGIN
    background = tuple(int(v) for v in colors.theme.background)
    image = Image.new("RGB", (width, height), background)
    draw = ImageDraw.Draw(image)
    used = int((owner >= 0).sum())
    quarantined = int((state == 4).sum())
    title = f"{pool['name']} ({pool.get('role') or 'pool'}): {len(owner):,} pages"
    if pool.get("page_size"):
        title += f" of {pool['page_size']} tokens"
    counts = f"{used:,} owned, {quarantined:,} quarantined"
    if crossed is not None:
        counts += f", {int(np.count_nonzero(crossed)):,} holding another request's data"
    lines = [(title, font, (235, 235, 235)), *([(when, font, (235, 235, 235))] if when else []),
             (f"{counts}; a cell per page, rows from page 0", small, (190, 190, 190))]
    for i, (text, face, colour) in enumerate(lines):
        draw.text((MARGIN, MARGIN + i * line), text, fill=colour, font=face)
    top = MARGIN + heads * line + 4
    image.paste(page_map, (MARGIN, top))
    y0 = top + page_map.height + MARGIN
    for i, (colour, label) in enumerate(swatches):
        x, y = MARGIN, y0 + i * line
        draw.rectangle((x, y + 4, x + 18, y + 22), fill=colour, outline=(200, 200, 200))
        draw.text((x + 28, y + 2), label, fill=(225, 225, 225), font=small)
    out = io.BytesIO()
    image.save(out, "PNG", optimize=True)
    return out.getvalue()


def _mark(page_map: Image.Image, cols: int, scale: int, crossed) -> int:
    """Dot each crossed page's cell (at least 3 pixels wide); returns how many were dotted."""
    if crossed is None or scale < 3:
        return 0
    pages = np.flatnonzero(np.asarray(crossed, dtype=bool))
    draw = ImageDraw.Draw(page_map)
    r = max(1, scale // 5)
    for page in pages:
        cx, cy = (int(page) % cols) * scale + scale // 2, (int(page) // cols) * scale + scale // 2
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=DOT)
    return len(pages)


def _legend(colors: PageColors, lut, owner, state, by_slot) -> list[tuple[tuple, str]]:
    rgb = lambda i: tuple(int(v) for v in lut[i, :3])  # noqa: E731
    swatches = [(rgb(FREE_PAGE), "free"), (rgb(QUARANTINED_PAGE), "quarantined (alarm colour)"),
                (rgb(CANARY_PAGE), "canary request")]
    owned = owner[owner >= 0]
    if len(owned):
        slots, counts = np.unique(owned, return_counts=True)
        dimmed = None
        for slot in slots[np.argsort(-counts, kind="stable")][:LEGEND_OWNERS]:
            colour = colors.colour_of_slot(int(slot))
            if colour is None or colour >= NUM_COLOURS:  # canary or neutral: swatches above
                continue
            dimmed = colour if dimmed is None else dimmed
            request = by_slot.get(int(slot)) or {}
            pages = int((owner == slot).sum())
            swatches.append((rgb(BRIGHT_BASE + colour),
                             f"{request.get('request_id', f'slot {slot}')} ({request.get('tenant') or '?'}), "
                             f"{pages:,} pages"))
        if dimmed is not None:
            swatches.append((rgb(DIM_BASE + dimmed), "dimmed: reserved, not yet written"))
    if len(owned) and len(np.unique(owned)) > LEGEND_OWNERS:
        swatches.append((rgb(NO_PAGE), f"... {len(np.unique(owned)) - LEGEND_OWNERS} more requests"))
    return swatches
