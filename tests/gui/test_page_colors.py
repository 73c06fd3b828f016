"""PageColors, PageGrid and PoolImage without Qt: reserved colours, owner colour recycling,
tenant and state modes, selection, and incremental images equal to full rebuilds."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.client import PageMirror
from engine.wire.protocol import pack, page_arrays, unpack
from gui.model import page_colors as pc
from gui.model.page_colors import (
    BRIGHT_BASE,
    DIM_BASE,
    FREE_PAGE,
    NEUTRAL,
    NEUTRAL_DIM,
    NO_PAGE,
    NUM_COLOURS,
    QUARANTINED_PAGE,
    RESERVED_INDICES,
    THEMES,
    PageColors,
    owner_palette,
    srgb_to_lab,
)
from gui.model.page_grid import PageGrid, PoolImage

REPO = Path(__file__).resolve().parents[2]
FREE, RESERVED, IN_FLIGHT, WRITTEN, QUARANTINED = range(5)


# ---- helpers ------------------------------------------------------------------------------

def empty_meta(n: int) -> dict[str, np.ndarray]:
    return {"owner": np.full(n, -1, np.int32), "epoch": np.zeros(n, np.int64), "writer": np.full(n, -1, np.int64),
            "filled": np.zeros(n, np.int32), "state": np.zeros(n, np.uint8)}


class Pool:
    """The engine side of one pool: sends a keyframe, then deltas of what `set` changed."""

    def __init__(self, mirror: PageMirror, name: str, n: int):
        self.mirror, self.name, self.n, self.seq = mirror, name, n, 0
        self.meta = empty_meta(n)
        self.send("keyframe")

    def send(self, kind: str, index=None) -> None:
        self.seq += 1
        header = {"topic": f"pages/{self.name}", "pool": self.name, "role": "prefill", "kind": kind,
                  "seq": self.seq, "num_pages": self.n, "page_size": 16}
        assert self.mirror.apply(unpack(pack(header, page_arrays(self.meta, index))))

    def set(self, pages, owner: int, state: int) -> None:
        pages = np.atleast_1d(np.asarray(pages, dtype=np.int32))
        self.meta["owner"][pages] = owner if state != FREE else -1
        self.meta["state"][pages] = state
        self.send("delta", pages)

    @property
    def pool(self):
        return self.mirror.pools[self.name]


def frame(colors: PageColors, *images_and_pools) -> None:
    """What the widget does per refresh: every pool updated, then colours recycled."""
    colors.begin_frame()
    for image, pool in images_and_pools:
        image.update(pool.pool)
    colors.end_frame()


def colour_of_page(image: PoolImage, page: int) -> int:
    index = int(image.image.reshape(-1)[page])
    assert index >= RESERVED_INDICES, f"page {page} shows reserved index {index}, not an owner colour"
    return (index - RESERVED_INDICES) % NUM_COLOURS


def luma(rgb) -> float:
    r, g, b = (float(c) for c in rgb[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


# ---- the model stays Qt-free ---------------------------------------------------------------

@pytest.mark.parametrize("module", ["page_colors", "page_grid"])
def test_model_modules_do_not_import_qt(module):
    tree = ast.parse((REPO / "gui" / "model" / f"{module}.py").read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    assert not [n for n in names if n.split(".")[0] in ("PySide6", "pyqtgraph", "shiboken6")]
    code = (f"import sys, gui.model.{module}; "
            "sys.exit(1 if {'PySide6', 'pyqtgraph'} & set(sys.modules) else 0)")
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0


def test_state_numbers_match_the_engine():
    from engine.wire.page_tags import PageState

    assert pc.STATE_NAMES == tuple(s.name for s in PageState)
    assert (pc.FREE, pc.RESERVED, pc.IN_FLIGHT, pc.WRITTEN, pc.QUARANTINED) == tuple(PageState)


# ---- the table ----------------------------------------------------------------------------

@pytest.mark.parametrize("theme", ["dark", "light"])
def test_reserved_indices_have_their_own_colours(theme):
    lut = PageColors(theme).lut()
    assert lut.shape == (256, 4) and lut.dtype == np.uint8 and (lut[:, 3] == 255).all()
    reserved = [NO_PAGE, FREE_PAGE, QUARANTINED_PAGE, pc.CANARY_PAGE, NEUTRAL, NEUTRAL_DIM]
    assert len({tuple(lut[i]) for i in reserved}) == len(reserved)
    assert tuple(lut[NO_PAGE, :3]) == THEMES[theme].background
    if theme == "dark":
        assert luma(lut[FREE_PAGE]) < 70  # free pages recede on a dark background
    else:
        assert luma(lut[FREE_PAGE]) > 200


@pytest.mark.parametrize("theme", ["dark", "light"])
def test_no_owner_colour_comes_near_the_quarantine_alarm(theme):
    lut = PageColors(theme).lut()
    owners = lut[BRIGHT_BASE:256, :3]
    alarm = lut[QUARANTINED_PAGE, :3]
    assert not (owners == alarm).all(axis=1).any()
    distance = np.linalg.norm(srgb_to_lab(owners) - srgb_to_lab(alarm), axis=1)  # deltaE76
    assert distance.min() > 40, f"owner colour {np.argmin(distance)} is {distance.min():.0f} deltaE from the alarm"


@pytest.mark.parametrize("theme", ["dark", "light"])
def test_owner_palette_is_distinct_and_has_a_dim_half(theme):
    bright, dim = owner_palette(THEMES[theme])
    assert len(bright) == NUM_COLOURS >= 110
    lab = srgb_to_lab(bright)
    gaps = np.linalg.norm(lab[:, None] - lab[None], axis=2) + np.eye(NUM_COLOURS) * 1e9
    assert gaps.min() > 10  # deltaE76: every pair tells apart side by side
    assert gaps[:12, :12].min() > 35  # the first colours handed out are far apart
    free = srgb_to_lab(THEMES[theme].free)
    assert (np.linalg.norm(lab - free, axis=1) > 35).all()
    # the dim half sits between the bright colour and the free grey
    assert (np.linalg.norm(srgb_to_lab(dim) - free, axis=1) < np.linalg.norm(lab - free, axis=1)).all()


# ---- owner colours --------------------------------------------------------------------------

def make(n: int = 64, pools: int = 1):
    mirror, colors = PageMirror(), PageColors()
    made = [(PoolImage(colors), Pool(mirror, f"pool-{i}", n)) for i in range(pools)]
    return colors, made


def test_a_live_owner_keeps_its_colour():
    colors, [(image, pool)] = make()
    pool.set(range(0, 4), owner=7, state=WRITTEN)
    frame(colors, (image, pool))
    mine = colour_of_page(image, 0)
    for slot in range(8, 30):  # others come and go around it
        pool.set(range(10, 14), owner=slot, state=WRITTEN)
        frame(colors, (image, pool))
        pool.set(range(10, 14), owner=-1, state=FREE)
        frame(colors, (image, pool))
    pool.set([4], owner=7, state=RESERVED)
    frame(colors, (image, pool))
    assert colour_of_page(image, 0) == colour_of_page(image, 4) == mine
    assert image.image.reshape(-1)[4] == DIM_BASE + mine  # reserved: the dim half, same colour


def test_colour_is_recycled_after_its_owner_frees_every_page():
    colors, [(image, pool)] = make()
    pool.set(range(0, 4), owner=1, state=WRITTEN)
    pool.set(range(4, 8), owner=2, state=WRITTEN)
    frame(colors, (image, pool))
    first, second = colour_of_page(image, 0), colour_of_page(image, 4)
    assert first != second
    pool.set(range(0, 3), owner=-1, state=FREE)
    frame(colors, (image, pool))
    assert colors.owners.cached(1) == first  # still holds page 3
    pool.set([3], owner=-1, state=FREE)
    frame(colors, (image, pool))
    assert colors.owners.cached(1) is None
    pool.set([20], owner=3, state=WRITTEN)
    frame(colors, (image, pool))
    assert colour_of_page(image, 20) == first  # the freed colour goes to the next new owner


def test_quarantined_pages_do_not_keep_a_colour():
    colors, [(image, pool)] = make()
    pool.set(range(0, 2), owner=1, state=WRITTEN)
    frame(colors, (image, pool))
    pool.set(range(0, 2), owner=1, state=QUARANTINED)
    frame(colors, (image, pool))
    assert (image.image.reshape(-1)[:2] == QUARANTINED_PAGE).all()
    assert colors.owners.cached(1) is None


def test_a_request_moving_between_pools_in_one_frame_keeps_its_colour():
    colors, [(prefill, p), (decode, d)] = make(pools=2)
    p.set(range(0, 4), owner=5, state=WRITTEN)
    frame(colors, (prefill, p), (decode, d))
    mine = colour_of_page(prefill, 0)
    p.set(range(0, 4), owner=-1, state=FREE)
    d.set(range(0, 4), owner=5, state=IN_FLIGHT)
    pool_new = 6
    d.set([10], owner=pool_new, state=WRITTEN)  # a new owner in the same frame must not take it
    frame(colors, (prefill, p), (decode, d))
    assert colour_of_page(decode, 0) == mine
    assert colour_of_page(decode, 10) != mine


def test_more_owners_than_colours_repeat_deterministically():
    def run():
        colors, [(image, pool)] = make(n=NUM_COLOURS + 16)
        for slot in range(1, NUM_COLOURS + 11):
            pool.set([slot - 1], owner=slot, state=WRITTEN)
            frame(colors, (image, pool))
        return [colour_of_page(image, p) for p in range(NUM_COLOURS + 10)]

    colours = run()
    assert colours == run()
    assert sorted(set(colours[:NUM_COLOURS])) == list(range(NUM_COLOURS))  # all distinct first
    assert colours[NUM_COLOURS:] == list(range(10))  # then the least-shared, lowest first


def test_unknown_owners_are_resolved_without_touching_known_ones():
    colors = PageColors()
    calls = []
    resolve = colors.owners._resolve
    colors.owners._resolve = lambda slot: (calls.append(slot), resolve(slot))[1]
    owner = np.array([3, 3, 4, -1, 3, 4], np.int32)
    state = np.array([WRITTEN] * 3 + [FREE] + [RESERVED] * 2, np.uint8)
    colors.owner_indices(owner, state)
    colors.owner_indices(owner, state)
    assert calls == [3, 4]  # once per new owner, not per page or per frame


# ---- modes and selection ------------------------------------------------------------------

def test_tenant_mode_colours_by_tenant_and_learns_late_tenants():
    tenants = {1: "acme", 2: "globex", 3: "acme"}
    colors, [(image, pool)] = make()
    colors.set_tenant_lookup(tenants.get)
    colors.mode = "tenant"
    for slot in (1, 2, 3, 4):
        pool.set(range(4 * slot, 4 * slot + 3), owner=slot, state=WRITTEN)
        pool.set([4 * slot + 3], owner=slot, state=RESERVED)
    frame(colors, (image, pool))
    flat = image.image.reshape(-1)
    assert flat[4] == flat[12] != flat[8]  # acme, acme, globex
    assert flat[4] == BRIGHT_BASE + colors.tenants.of_tenant["acme"]
    assert flat[7] == DIM_BASE + colors.tenants.of_tenant["acme"]
    assert flat[16] == NEUTRAL and flat[19] == NEUTRAL_DIM  # slot 4: tenant not known yet
    tenants[4] = "initech"
    frame(colors, (image, pool))
    assert image.image.reshape(-1)[16] == BRIGHT_BASE + colors.tenants.of_tenant["initech"]


def test_state_mode_colours_by_state_and_marks_the_selection():
    colors, [(image, pool)] = make()
    for page, (owner, state) in enumerate([(1, RESERVED), (1, IN_FLIGHT), (1, WRITTEN), (2, WRITTEN),
                                           (2, QUARANTINED), (-1, FREE)]):
        pool.set([page], owner=owner, state=state)
    colors.mode = "state"
    frame(colors, (image, pool))
    flat = image.image.reshape(-1)
    expected = [pc.STATE_BASE + RESERVED, pc.STATE_BASE + IN_FLIGHT, pc.STATE_BASE + WRITTEN,
                pc.STATE_BASE + WRITTEN, QUARANTINED_PAGE, FREE_PAGE]
    assert flat[:6].tolist() == expected
    colors.selected_slot = 1
    frame(colors, (image, pool))
    assert image.image.reshape(-1)[:4].tolist() == [pc.SELECTED_STATE_BASE + 1, pc.SELECTED_STATE_BASE + 2,
                                                    pc.SELECTED_STATE_BASE + 3, pc.STATE_BASE + WRITTEN]
    lut = colors.lut(1)
    assert (lut[pc.SELECTED_STATE_BASE + 3] == colors.lut()[pc.STATE_BASE + WRITTEN]).all()
    assert luma(lut[pc.STATE_BASE + WRITTEN]) < 0.5 * luma(colors.lut()[pc.STATE_BASE + WRITTEN])


def test_selection_lut_dims_everything_but_the_selected_request():
    colors, [(image, pool)] = make()
    pool.set(range(0, 3), owner=1, state=WRITTEN)
    pool.set(range(3, 6), owner=2, state=WRITTEN)
    frame(colors, (image, pool))
    mine, other = colour_of_page(image, 0), colour_of_page(image, 3)
    base, selected = colors.lut(), colors.lut(selected_slot=1)
    for index in (BRIGHT_BASE + mine, DIM_BASE + mine, QUARANTINED_PAGE, NO_PAGE):
        assert (selected[index] == base[index]).all(), index
    dimmed = [i for i in range(256) if i not in (BRIGHT_BASE + mine, DIM_BASE + mine, QUARANTINED_PAGE, NO_PAGE)]
    background = np.asarray(THEMES["dark"].background, float)
    before = np.linalg.norm(base[dimmed, :3] - background, axis=1)
    after = np.linalg.norm(selected[dimmed, :3] - background, axis=1)
    assert (after <= 0.3 * before + 1.5).all()
    assert luma(selected[BRIGHT_BASE + other]) < 0.5 * luma(base[BRIGHT_BASE + other])
    assert (colors.lut(selected_slot=None) == base).all()


def test_mode_and_theme_reject_unknown_names():
    colors = PageColors()
    with pytest.raises(ValueError, match="colour mode"):
        colors.mode = "owner"
    with pytest.raises(ValueError, match="theme"):
        colors.set_theme("sepia")


# ---- geometry ------------------------------------------------------------------------------

@pytest.mark.parametrize("n, cols, rows", [(1_048_576, 1024, 1024), (681_280, 832, 819), (100, 16, 7), (1, 8, 1),
                                           (0, 8, 1)])
def test_grid_geometry(n, cols, rows):
    grid = PageGrid.for_pages(n)
    assert (grid.cols, grid.rows) == (cols, rows)
    assert grid.cols % 8 == 0 and grid.cols * grid.rows >= n


def test_grid_maps_pages_cells_and_points():
    grid = PageGrid.for_pages(100)
    for page in (0, 15, 16, 99):
        row, col = grid.cell_of(page)
        assert grid.page_of(row, col) == page
        assert grid.page_at(*grid.cell_center(page)) == page
    assert grid.page_at(15.99, 0.0) == 15 and grid.page_at(0.0, 1.0) == 16
    assert grid.page_at(5.5, 6.5) is None  # padding: row 6 holds pages 96..99 only
    assert grid.page_at(-0.1, 0) is None and grid.page_at(0, 7.0) is None and grid.page_at(float("nan"), 0) is None
    with pytest.raises(IndexError):
        grid.cell_of(100)


# ---- incremental == full --------------------------------------------------------------------

def full_image(colors: PageColors, pool, grid: PageGrid, mode_indices) -> np.ndarray:
    flat = np.full(grid.rows * grid.cols, NO_PAGE, np.uint8)
    flat[:pool.num_pages] = mode_indices(pool.arrays["owner"], pool.arrays["state"])
    return flat.reshape(grid.rows, grid.cols)


deltas = st.lists(
    st.tuples(st.lists(st.integers(0, 199), min_size=1, max_size=60, unique=True),  # pages
              st.integers(-1, 40),  # owner
              st.integers(0, 5),  # state (5: a value this GUI does not know)
              st.booleans()),  # refresh after this delta (False: the next refresh missed it)
    min_size=1, max_size=25)


@settings(max_examples=60, deadline=None)
@given(deltas=deltas, mode=st.sampled_from(["request", "tenant", "state"]), selected=st.sampled_from([None, 3]))
def test_incremental_updates_equal_a_full_rebuild(deltas, mode, selected):
    mirror, colors = PageMirror(), PageColors(tenant_of_slot=lambda s: f"t{s % 3}" if s % 5 else None)
    colors.mode, colors.selected_slot = mode, selected
    pool = Pool(mirror, "p", 200)
    image = PoolImage(colors)
    frame(colors, (image, pool))
    for pages, owner, state, refresh in deltas:
        pool.meta["owner"][pages], pool.meta["state"][pages] = owner, state
        pool.send("delta", np.asarray(pages))
        if refresh:
            frame(colors, (image, pool))
    frame(colors, (image, pool))
    p = pool.pool
    assert (image.owner_image == full_image(colors, p, image.grid, colors.owner_indices)).all()
    assert (image.image == full_image(colors, p, image.grid, colors.display_indices)).all()
    assert (image.counts == np.bincount(image.owner_image.reshape(-1), minlength=256)).all()
    # every page shown in a colour has its owner holding that colour
    shown = image.owner_image.reshape(-1)[:p.num_pages]
    coloured = shown >= BRIGHT_BASE
    for slot in np.unique(p.arrays["owner"][coloured]):
        assert colors.owners.cached(int(slot)) is not None


def test_only_changed_pages_are_recomputed_and_missed_deltas_are_diffed():
    colors, [(image, pool)] = make(n=4096)
    frame(colors, (image, pool))
    pool.set([5, 6, 7], owner=1, state=WRITTEN)
    frame(colors, (image, pool))
    assert image.last_update_pages == 3
    pool.set([8], owner=1, state=WRITTEN)
    pool.set([9, 10], owner=2, state=RESERVED)  # two messages between refreshes
    frame(colors, (image, pool))
    assert image.last_update_pages == 3  # found by diffing, not a full rebuild
    assert image.used_pages == 6
    frame(colors, (image, pool))
    assert image.last_update_pages == 0


def test_a_keyframe_of_another_size_rebuilds_the_grid_and_gives_colours_back():
    colors, [(image, pool)] = make(n=64)
    pool.set(range(0, 8), owner=1, state=WRITTEN)
    frame(colors, (image, pool))
    assert colors.owners.pages.sum() == 8
    pool.n, pool.meta = 100, empty_meta(100)  # the worker restarted with a bigger pool
    pool.meta["owner"][:3], pool.meta["state"][:3] = 2, WRITTEN
    pool.send("keyframe")
    frame(colors, (image, pool))
    assert (image.grid.rows, image.grid.cols) == (7, 16) and image.image.shape == (7, 16)
    assert (image.counts == np.bincount(image.owner_image.reshape(-1), minlength=256)).all()
    assert colors.owners.pages.sum() == 3 and colors.owners.cached(1) is None
    assert image.used_pages == 3 and (image.image.reshape(-1)[100:] == NO_PAGE).all()


def test_canary_requests_show_the_canary_colour_in_request_and_tenant_modes():
    import numpy as np

    from gui.model.page_colors import CANARY_PAGE, PageColors

    tenants = {1: "acme", 2: "canary"}
    colors = PageColors("dark", tenants.get)
    owner = np.array([1, 2, 2, -1], dtype=np.int32)
    state = np.array([3, 3, 1, 0], dtype=np.uint8)
    for mode in ("request", "tenant"):
        colors.mode = mode
        idx = colors.display_indices(owner, state)
        assert idx[1] == CANARY_PAGE and idx[2] == CANARY_PAGE  # written and reserved alike
        assert idx[0] != CANARY_PAGE
    assert tuple(colors.lut()[CANARY_PAGE, :3]) != tuple(colors.lut()[idx[0], :3])
