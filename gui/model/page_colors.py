"""PageColors: the 256-colour lookup table of the page map and who gets which colour.

A pool is drawn as a uint8 index image (pyqtgraph's fast Indexed8 path); this module
decides what each index means. The first RESERVED indices are fixed meanings (no page,
free, quarantined, state colours, ...); the rest is an owner palette in two halves:
BRIGHT_BASE + c for a written page of colour c, DIM_BASE + c for the same colour on a
page that is reserved or in flight but not yet written.

Owner colours are recycled: a request keeps its colour while it holds a page in any
pool; once none of a colour's pages are left (counted from the index images), the colour
is free for the next new request. More live requests than colours share colours in a
fixed order (the colour with the fewest owners, lowest index first).

Qt-free: numpy only. Callers: gui.model.page_grid.PoolImage, gui.widgets.page_map.
"""

from __future__ import annotations

import colorsys
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from engine.wire.page_tags import FREE_OWNER, PageState
from engine.wire.protocol import CANARY_TENANT
from gui.model.selection import Selection

# Page states as they travel in PAGE_FIELDS["state"], as plain ints for numpy indexing.
FREE, RESERVED, IN_FLIGHT, WRITTEN, QUARANTINED = (int(s) for s in PageState)
STATE_NAMES = tuple(s.name for s in PageState)

# ---- the index space ----------------------------------------------------------------
NO_PAGE = 0  # padding cells of the grid beyond the last page
FREE_PAGE = 1
QUARANTINED_PAGE = 2  # the alarm colour: no owner colour comes near it
CANARY_PAGE = 3  # reserved for canary (marker) pages
NEUTRAL = 4  # an owned page whose colour is unknown (tenant mode: tenant not known yet)
NEUTRAL_DIM = 5
STATE_BASE = 5  # state mode: STATE_BASE + state for RESERVED, IN_FLIGHT, WRITTEN (6, 7, 8)
SELECTED_STATE_BASE = 8  # state mode, pages of the selected request (9, 10, 11)
UNKNOWN_STATE = 12  # a state value this GUI does not know
RESERVED_INDICES = 16  # 13..15 spare
NUM_COLOURS = (256 - RESERVED_INDICES) // 2  # 120 owner colours
BRIGHT_BASE = RESERVED_INDICES
DIM_BASE = RESERVED_INDICES + NUM_COLOURS
NEUTRAL_COLOUR = 255  # colour id meaning "no palette colour" (never a real colour: < NUM_COLOURS)
CANARY_COLOUR = 254  # colour id of canary requests' pages (their own colour, never an owner's)

MODES = ("request", "tenant", "state")
LEVELS = (0, 256)  # pyqtgraph levels giving the identity index -> LUT mapping for 0..255

# Direct-mapped slot tables: slots count up from 1 and are never reused, so (slot + 1) & MASK
# is a key; the stored slot tells a hit from a collision. Key 0 is pinned to FREE_OWNER.
_TABLE_BITS = 20
_MASK = (1 << _TABLE_BITS) - 1
_EMPTY = -2
_MAX_UNKNOWN_TENANTS = 4096  # slots asked again for their tenant on every frame

_ALARM_HUE = 325.0  # degrees; owner hues keep out of _ALARM_HUE +- _ALARM_GAP
_ALARM_GAP = 45.0


@dataclass(frozen=True)
class Theme:
    """The reserved colours of one UI theme (RGB)."""

    name: str
    background: tuple[int, int, int]  # the plot background; the widget passes the app's own
    free: tuple[int, int, int]
    quarantined: tuple[int, int, int]
    canary: tuple[int, int, int]
    neutral: tuple[int, int, int]
    states: tuple[tuple[int, int, int], ...]  # RESERVED, IN_FLIGHT, WRITTEN
    unknown_state: tuple[int, int, int]
    dim_toward: tuple[int, int, int]  # unwritten pages blend toward this
    dim_keep: float  # fraction of the colour an unwritten page keeps
    value_tiers: tuple[float, ...]  # HSV values and saturations of palette candidates
    saturation_tiers: tuple[float, ...]
    lightness: tuple[float, float]  # CIELAB L* range of owner colours


THEMES = {
    "dark": Theme("dark", background=(22, 24, 27), free=(50, 54, 60), quarantined=(255, 0, 150),
                  canary=(255, 255, 255), neutral=(175, 175, 175),
                  states=((205, 150, 40), (70, 140, 255), (60, 190, 110)), unknown_state=(255, 255, 0),
                  dim_toward=(50, 54, 60), dim_keep=0.45, value_tiers=(0.7, 0.8, 0.9, 1.0),
                  saturation_tiers=(0.45, 0.6, 0.75, 0.9, 1.0), lightness=(50.0, 92.0)),
    "light": Theme("light", background=(255, 255, 255), free=(222, 224, 228), quarantined=(230, 0, 140),
                   canary=(0, 0, 0), neutral=(120, 120, 120),
                   states=((215, 150, 20), (40, 110, 230), (35, 150, 75)), unknown_state=(140, 140, 0),
                   dim_toward=(222, 224, 228), dim_keep=0.45, value_tiers=(0.45, 0.6, 0.75, 0.9, 1.0),
                   saturation_tiers=(0.5, 0.65, 0.8, 0.95), lightness=(30.0, 78.0)),
}


def srgb_to_lab(rgb) -> np.ndarray:
    """sRGB (0..255, any shape (..., 3)) -> CIELAB under D65; distances there are deltaE76."""
    c = np.asarray(rgb, dtype=np.float64) / 255.0
    linear = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    to_xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]])
    xyz = linear @ to_xyz.T / np.array([0.95047, 1.0, 1.08883])
    d = 6 / 29
    f = np.where(xyz > d ** 3, np.cbrt(xyz), xyz / (3 * d * d) + 4 / 29)
    return np.stack([116 * f[..., 1] - 16, 500 * (f[..., 0] - f[..., 1]), 200 * (f[..., 1] - f[..., 2])], axis=-1)


def owner_palette(theme: Theme, n: int = NUM_COLOURS) -> tuple[np.ndarray, np.ndarray]:
    """(bright, dim): two (n, 3) uint8 RGB arrays. Bright colours are picked greedily, each
    the candidate farthest (in CIELAB) from all picked before, so every prefix of the
    palette is spread out; candidates keep away from the alarm hue, the free grey and the
    background. Dim colours are the bright ones blended toward the free grey."""
    hues = [h for h in range(0, 360, 4) if abs((h - _ALARM_HUE + 180) % 360 - 180) > _ALARM_GAP]
    rgb = np.array([colorsys.hsv_to_rgb(h / 360, sat, val) for h in hues
                    for sat in theme.saturation_tiers for val in theme.value_tiers]) * 255
    lab = srgb_to_lab(rgb)
    lightness_low, lightness_high = theme.lightness
    far = ((np.linalg.norm(lab - srgb_to_lab(theme.quarantined), axis=1) > 50)
           & (np.linalg.norm(lab - srgb_to_lab(theme.free), axis=1) > 35)
           & (lab[:, 0] >= lightness_low) & (lab[:, 0] <= lightness_high))
    rgb, lab = rgb[far], lab[far]
    nearest = np.linalg.norm(lab - srgb_to_lab(theme.free), axis=1)  # start far from "free"
    picked = []
    for _ in range(n):
        i = int(np.argmax(nearest))
        picked.append(i)
        nearest = np.minimum(nearest, np.linalg.norm(lab - lab[i], axis=1))
    bright = np.round(rgb[picked])
    toward = np.asarray(theme.dim_toward, dtype=np.float64)
    dim = np.round(toward + theme.dim_keep * (bright - toward))
    return bright.astype(np.uint8), dim.astype(np.uint8)


def base_lut(theme: Theme) -> np.ndarray:
    """The (256, 4) uint8 RGBA table with nothing selected."""
    lut = np.zeros((256, 4), dtype=np.uint8)
    lut[:, 3] = 255
    lut[:, :3] = theme.unknown_state  # spare indices: loud, so a stray index shows
    lut[NO_PAGE, :3] = theme.background
    lut[FREE_PAGE, :3] = theme.free
    lut[QUARANTINED_PAGE, :3] = theme.quarantined
    lut[CANARY_PAGE, :3] = theme.canary
    lut[NEUTRAL, :3] = theme.neutral
    toward = np.asarray(theme.dim_toward, dtype=np.float64)
    lut[NEUTRAL_DIM, :3] = np.round(toward + theme.dim_keep * (np.asarray(theme.neutral) - toward))
    for i, rgb in enumerate(theme.states):
        lut[STATE_BASE + 1 + i, :3] = rgb
        lut[SELECTED_STATE_BASE + 1 + i, :3] = rgb
    lut[UNKNOWN_STATE, :3] = theme.unknown_state
    bright, dim = owner_palette(theme)
    lut[BRIGHT_BASE:BRIGHT_BASE + NUM_COLOURS, :3] = bright
    lut[DIM_BASE:DIM_BASE + NUM_COLOURS, :3] = dim
    return lut


class SlotColours:
    """slot -> colour id through a direct-mapped table; `resolve` is called (in Python) only
    for slots the table does not hold yet, and returns (colour, cache_it)."""

    def __init__(self, resolve: Callable[[int], tuple[int, bool]]):
        self._resolve = resolve
        self.key_slot = np.full(1 << _TABLE_BITS, _EMPTY, dtype=np.int32)
        self.key_colour = np.full(1 << _TABLE_BITS, NEUTRAL_COLOUR, dtype=np.uint8)
        self.key_slot[0] = FREE_OWNER

    def colours(self, owners: np.ndarray, state: np.ndarray | None = None) -> np.ndarray:
        """uint8 colour id per owner (NEUTRAL_COLOUR for FREE_OWNER and uncached unknowns).
        With `state`, only pages whose state shows an owner colour may claim a new one;
        the others' colour ids are meaningless."""
        keys = owners.astype(np.intp)  # numpy indexes with intp several times faster than int32
        keys += 1
        keys &= _MASK
        colour = self.key_colour[keys]
        unknown = self.key_slot[keys] != owners
        if unknown.any():
            where = np.flatnonzero(unknown)
            if state is not None:
                where = where[_TAKES_COLOUR[state[where]]]
            slots = owners[where]
            if len(slots):
                colour[where] = _per_distinct(slots, self._lookup)
        return colour

    def _lookup(self, slot: int) -> int:
        if slot < 0:
            return NEUTRAL_COLOUR
        colour, cache = self._resolve(slot)
        key = (slot + 1) & _MASK
        if cache and key != 0:
            self.evicted(int(self.key_slot[key]))
            self.key_slot[key] = slot
            self.key_colour[key] = colour
        return colour

    def cached(self, slot: int) -> int | None:
        key = (slot + 1) & _MASK
        return int(self.key_colour[key]) if slot >= 0 and self.key_slot[key] == slot else None

    def forget(self, slot: int) -> None:
        key = (slot + 1) & _MASK
        if key != 0 and self.key_slot[key] == slot:
            self.key_slot[key] = _EMPTY

    def evicted(self, slot: int) -> None:
        """Hook: a cached slot lost its table entry to a colliding slot."""


class OwnerColours(SlotColours):
    """Request slot -> owner colour, with recycling driven by per-colour page counts.
    Canary requests (tenant `canary`) all show the canary colour."""

    def __init__(self, tenant_of_slot: Callable[[int], str | None] | None = None):
        super().__init__(self._assign)
        self.tenant_of_slot = tenant_of_slot or (lambda slot: None)
        self.pages = np.zeros(NUM_COLOURS, dtype=np.int64)  # pages shown in each colour, all pools
        self.owners = np.zeros(NUM_COLOURS, dtype=np.int64)  # slots assigned to each colour
        self._slots: list[set[int]] = [set() for _ in range(NUM_COLOURS)]

    def _assign(self, slot: int) -> tuple[int, bool]:
        if self.tenant_of_slot(slot) == CANARY_TENANT:
            return CANARY_COLOUR, True
        colour = int(np.argmin(self.owners))  # a free colour (0 owners) first, lowest index
        self.owners[colour] += 1
        self._slots[colour].add(slot)
        return colour, True

    def evicted(self, slot: int) -> None:
        if slot >= 0:
            for colour, slots in enumerate(self._slots):
                if slot in slots:
                    slots.discard(slot)
                    self.owners[colour] -= 1
                    break

    def count(self, index_delta: np.ndarray) -> None:
        """Add a (256,) change in per-index page counts of an owner-mode image."""
        self.pages += index_delta[BRIGHT_BASE:BRIGHT_BASE + NUM_COLOURS]
        self.pages += index_delta[DIM_BASE:DIM_BASE + NUM_COLOURS]

    def release_unused(self) -> list[int]:
        """Free every colour none of whose pages is left; returns the colours freed. Call
        once all pools of a frame are updated (a request moving between pools keeps its
        colour)."""
        freed = np.flatnonzero((self.pages <= 0) & (self.owners > 0)).tolist()
        for colour in freed:
            for slot in self._slots[colour]:
                self.forget(slot)
            self._slots[colour].clear()
            self.owners[colour] = 0
        return freed


class TenantColours(SlotColours):
    """Request slot -> tenant colour. Tenants get colours in first-seen order; slots whose
    tenant is not known yet stay neutral and are asked again by `learn()`."""

    def __init__(self, tenant_of_slot: Callable[[int], str | None] | None = None):
        super().__init__(self._tenant_colour)
        self.tenant_of_slot = tenant_of_slot or (lambda slot: None)
        self.of_tenant: dict[str, int] = {}
        self.unknown: set[int] = set()

    def _tenant_colour(self, slot: int) -> tuple[int, bool]:
        tenant = self.tenant_of_slot(slot)
        if not tenant:
            self.unknown.add(slot)
            return NEUTRAL_COLOUR, False
        self.unknown.discard(slot)
        if tenant == CANARY_TENANT:
            return CANARY_COLOUR, True
        return self.colour_of_tenant(tenant), True  # a slot's tenant never changes

    def colour_of_tenant(self, tenant: str) -> int:
        colour = self.of_tenant.get(tenant)
        if colour is None:
            colour = self.of_tenant[tenant] = len(self.of_tenant) % NUM_COLOURS
        return colour

    def learn(self) -> bool:
        """True when a slot shown neutral has a known tenant now (the images need a rebuild)."""
        if len(self.unknown) > _MAX_UNKNOWN_TENANTS:  # a GUI that never saw these requests
            self.unknown.clear()
            return False
        learned = [slot for slot in self.unknown if self.tenant_of_slot(slot)]
        self.unknown.difference_update(learned)
        return bool(learned)


class PageColors:
    """Colour mode, theme, owner/tenant colour assignment and the LUT, shared by all pools.

    `generation` changes whenever index images must be recomputed in full (mode change,
    selection in state mode, a tenant learned); PoolImage compares it on every update.
    """

    def __init__(self, theme: str = "dark", tenant_of_slot: Callable[[int], str | None] | None = None, *,
                 background: tuple[int, int, int] | None = None, selection: Selection | None = None):
        self.owners = OwnerColours(tenant_of_slot)
        self.tenants = TenantColours(tenant_of_slot)
        self._mode = "request"
        self.set_theme(theme, background)
        self.selection = selection if selection is not None else Selection()  # the window's, read here
        self._selected: int | None = self.selection.slot  # the slot the images were computed for
        self.generation = 0

    # ---- settings -------------------------------------------------------------------
    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"colour mode {mode!r} is not one of {', '.join(MODES)}")
        if mode != self._mode:
            self._mode = mode
            self.generation += 1

    @property
    def theme(self) -> Theme:
        return self._theme

    def set_theme(self, name: str, background: tuple[int, int, int] | None = None) -> None:
        """"dark" or "light", optionally on the app's own plot background (RGB); raises
        ValueError for any other name. Only the LUT changes."""
        if name not in THEMES:
            raise ValueError(f"theme {name!r} is not one of {', '.join(THEMES)}")
        theme = THEMES[name]
        self._theme = theme if background is None else replace(theme, background=tuple(background))
        self._base = base_lut(self._theme)

    @property
    def selected_slot(self) -> int | None:
        return self.selection.slot

    @selected_slot.setter
    def selected_slot(self, slot: int | None) -> None:
        keep = self.selection.request_id if slot == self.selection.slot else None
        self.selection.select(keep, slot)
        self._follow_selection()

    def _follow_selection(self) -> None:
        if self.selection.slot != self._selected:
            self._selected = self.selection.slot
            if self._mode == "state":
                self.generation += 1  # state-mode images mark the selected request's pages

    def set_tenant_lookup(self, tenant_of_slot: Callable[[int], str | None]) -> None:
        self.tenants.tenant_of_slot = tenant_of_slot
        self.owners.tenant_of_slot = tenant_of_slot

    def begin_frame(self) -> None:
        """Before updating the pools of a frame: pick up the selection and the tenants learned
        since the last one."""
        self._follow_selection()
        if self._mode == "tenant" and self.tenants.learn():
            self.generation += 1

    def end_frame(self) -> None:
        """After updating every pool of a frame: recycle colours nobody shows any more."""
        self.owners.release_unused()

    # ---- per-page indices -------------------------------------------------------------
    def owner_indices(self, owner: np.ndarray, state: np.ndarray) -> np.ndarray:
        """uint8 request-mode index per page (the image that colour recycling counts)."""
        return _index_of(state, self.owners.colours(owner, state))

    def display_indices(self, owner: np.ndarray, state: np.ndarray) -> np.ndarray:
        """uint8 index per page in the current mode."""
        if self._mode == "state":
            idx = _STATE_INDEX[state]
            if self._selected is not None:
                mine = (owner == self._selected) & _TAKES_COLOUR[state]
                idx[mine] += SELECTED_STATE_BASE - STATE_BASE
            return idx
        if self._mode == "tenant":
            return _index_of(state, self.tenants.colours(owner, state))
        return self.owner_indices(owner, state)

    # ---- the table --------------------------------------------------------------------
    def colour_of_slot(self, slot: int) -> int | None:
        """The colour id a request shows in the current mode, or None."""
        if self._mode == "tenant":
            tenant = self.tenants.tenant_of_slot(slot)
            return self.tenants.of_tenant.get(tenant) if tenant else None
        return self.owners.cached(slot)

    def lut(self, selected_slot: int | None = None) -> np.ndarray:
        """(256, 4) uint8 RGBA. With a selected slot, everything but that request's colours
        (its tenant's, in tenant mode; its pages, in state mode) is dimmed strongly; the
        quarantined alarm colour and the no-page background are never dimmed."""
        lut = self._base.copy()
        if selected_slot is None:
            return lut
        keep = np.zeros(256, dtype=bool)
        keep[[NO_PAGE, QUARANTINED_PAGE]] = True
        if self._mode == "state":
            keep[SELECTED_STATE_BASE + 1:SELECTED_STATE_BASE + 4] = True
        else:
            colour = self.colour_of_slot(selected_slot)
            if colour is not None and colour < NUM_COLOURS:
                keep[[BRIGHT_BASE + colour, DIM_BASE + colour]] = True
        background = np.asarray(self._theme.background, dtype=np.float64)
        faded = np.round(background + 0.22 * (lut[:, :3] - background))
        lut[~keep, :3] = faded[~keep]
        return lut

    def swatch(self, slot: int) -> tuple[int, int, int] | None:
        """The RGB of a slot's written pages in the current mode (the index the map gives
        them, through the same table); None in state mode or while it has no colour."""
        if self._mode == "state" or slot < 0:
            return None
        colour = self.colour_of_slot(slot)
        if colour is None:
            return None
        index = int(_index_of(np.array([WRITTEN]), np.array([colour]))[0])
        return None if index == NEUTRAL else self.rgba(index)[:3]

    def rgba(self, index: int, selected_slot: int | None = None) -> tuple[int, int, int, int]:
        r, g, b, a = self.lut(selected_slot)[index]
        return int(r), int(g), int(b), int(a)


def _per_distinct(slots: np.ndarray, lookup: Callable[[int], int]) -> np.ndarray:
    """lookup() once per distinct slot, spread back to every position (uint8). Over a small
    range of slots (the usual case) a bincount and a dense table: a keyframe's 700k unknown
    pages take ~5 ms instead of ~80 ms for np.unique's sort and inverse."""
    low, high = int(slots.min()), int(slots.max())
    if high - low < (1 << 22):
        offset = slots.astype(np.intp) - low
        distinct = np.flatnonzero(np.bincount(offset))
        table = np.zeros(high - low + 1, dtype=np.uint8)
        table[distinct] = [lookup(int(s) + low) for s in distinct]
        return table[offset]
    distinct, inverse = np.unique(slots, return_inverse=True)
    return np.array([lookup(int(s)) for s in distinct], dtype=np.uint8)[inverse]


def _index_table() -> np.ndarray:
    """(256 states x 256 colour ids) -> index, so that one gather colours a page."""
    table = np.full((256, 256), UNKNOWN_STATE, dtype=np.uint8)
    table[FREE, :] = FREE_PAGE
    table[QUARANTINED, :] = QUARANTINED_PAGE
    for state, base, neutral in ((RESERVED, DIM_BASE, NEUTRAL_DIM), (IN_FLIGHT, DIM_BASE, NEUTRAL_DIM),
                                 (WRITTEN, BRIGHT_BASE, NEUTRAL)):
        table[state, :] = neutral
        table[state, :NUM_COLOURS] = base + np.arange(NUM_COLOURS)
        table[state, CANARY_COLOUR] = CANARY_PAGE
    return table.reshape(-1)


_INDEX = _index_table()
_TAKES_COLOUR = np.zeros(256, dtype=bool)
_TAKES_COLOUR[[RESERVED, IN_FLIGHT, WRITTEN]] = True
_STATE_INDEX = np.full(256, UNKNOWN_STATE, dtype=np.uint8)
_STATE_INDEX[[FREE, RESERVED, IN_FLIGHT, WRITTEN, QUARANTINED]] = (
    FREE_PAGE, STATE_BASE + RESERVED, STATE_BASE + IN_FLIGHT, STATE_BASE + WRITTEN, QUARANTINED_PAGE)


def _index_of(state: np.ndarray, colour: np.ndarray) -> np.ndarray:
    key = state.astype(np.intp)
    key <<= 8
    key |= colour
    return _INDEX[key]
