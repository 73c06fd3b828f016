"""PageMapWidget on real protocol messages: rendered pixels, hover text, click-to-select
across pools, colour modes and themes (offscreen Qt, pytest-qt)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyqtgraph as pg
import pytest
from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QColor, QImage

from engine.wire.protocol import pack, page_arrays, unpack
from gui import theme
from gui.model.engine_state import EngineState
from gui.model.page_colors import (
    BRIGHT_BASE,
    DIM_BASE,
    FREE_PAGE,
    LEVELS,
    NEUTRAL,
    QUARANTINED_PAGE,
    STATE_BASE,
    THEMES,
    PageColors,
)
from gui.widgets.page_map import PageMapWidget
from tests.gui.page_map_widget import show_page_map

FREE, RESERVED, IN_FLIGHT, WRITTEN, QUARANTINED = range(5)
REQUESTS = {1: ("req-a", "acme"), 2: ("req-b", "globex"), 3: ("req-c", "acme"), 4: ("req-d", "initech")}

# (pool, role, num_pages, [(first page, last page, slot, state, epoch)])
LAYOUT = [
    ("prefill-0", "prefill", 64, [(0, 9, 1, WRITTEN, 2), (10, 14, 2, WRITTEN, 1), (15, 17, 2, RESERVED, 1),
                                  (18, 18, 3, QUARANTINED, 4)]),
    ("decode-0", "decode", 100, [(0, 4, 1, IN_FLIGHT, 1), (5, 9, 2, WRITTEN, 3), (10, 10, 9, WRITTEN, 1),
                                 (11, 11, 4, QUARANTINED, 2)]),
]


def keyframe(name: str, role: str, n: int, runs, seq: int = 1) -> list:
    meta = {"owner": np.full(n, -1, np.int32), "epoch": np.zeros(n, np.int64), "writer": np.full(n, -1, np.int64),
            "filled": np.zeros(n, np.int32), "state": np.zeros(n, np.uint8)}
    for first, last, slot, state, epoch in runs:
        pages = slice(first, last + 1)
        meta["owner"][pages], meta["state"][pages], meta["epoch"][pages] = slot, state, epoch
        if state == WRITTEN:
            meta["writer"][pages], meta["filled"][pages] = (slot << 32) | epoch, 16
    header = {"topic": f"pages/{name}", "pool": name, "role": role, "kind": "keyframe", "seq": seq,
              "num_pages": n, "page_size": 16}
    return pack(header, page_arrays(meta))


def delta(name: str, seq: int, pages, owner: int, state: int, epoch: int, writer: int = -1,
          filled: int | None = None) -> list:
    k = len(pages)
    filled = (16 if state == WRITTEN else 0) if filled is None else filled
    arrays = {"owner": np.full(k, owner, np.int32), "epoch": np.full(k, epoch, np.int64),
              "writer": np.full(k, writer, np.int64), "filled": np.full(k, filled, np.int32),
              "state": np.full(k, state, np.uint8)}
    header = {"topic": f"pages/{name}", "pool": name, "kind": "delta", "seq": seq}
    return pack(header, {"index": np.asarray(pages, np.int32), **page_arrays(arrays)})  # as PageTelemetry sends


@pytest.fixture
def state() -> EngineState:
    s = EngineState()
    for name, role, n, runs in reversed(LAYOUT):  # arrival order must not decide the layout
        s.apply(unpack(keyframe(name, role, n, runs)))
    for slot, (rid, tenant) in REQUESTS.items():
        s.apply(unpack(pack({"topic": "requests", "seq": slot, "request_id": rid, "slot": slot, "tenant": tenant,
                             "phase": "decoding", "prompt_len": 100, "pages": {"prefill-0": 3}})))
    return s


@pytest.fixture
def widget(qtbot, state) -> PageMapWidget:
    return show_page_map(qtbot, state, (900, 520))


def cell_point(w: PageMapWidget, pool: str, page: int) -> QPoint:
    """The viewport pixel at the middle of a page's cell."""
    return w.graphics.mapFromScene(w.scene_pos_of(pool, page))


def pixel(w: PageMapWidget, pool: str, page: int, image: QImage | None = None) -> tuple[int, int, int]:
    """The rendered colour at the middle of a page's cell."""
    image = image if image is not None else w.graphics.viewport().grab().toImage()
    c = image.pixelColor(cell_point(w, pool, page))
    return c.red(), c.green(), c.blue()


def lut_rgb(w: PageMapWidget, index: int, selected_slot=None) -> tuple[int, int, int]:
    return tuple(int(v) for v in w.colors.lut(selected_slot)[index, :3])


def owner_index(w: PageMapWidget, pool: str, page: int) -> int:
    return int(w._views[pool].image.image.reshape(-1)[page])


# ---- layout and pixels ----------------------------------------------------------------

def test_pools_are_laid_out_prefill_first_with_titles(widget):
    assert widget.pool_names == ["prefill-0", "decode-0"]
    titles = [widget._views[name].title.text for name in widget.pool_names]
    assert "prefill-0" in titles[0] and "19/64 used" in titles[0] and "1 quarantined" in titles[0]
    assert "decode-0" in titles[1] and "12/100 used" in titles[1]
    item = widget._views["prefill-0"].item
    assert item.autoDownsample is False and item.axisOrder == "row-major"
    widget.graphics.viewport().grab()
    assert item.qimage.format() == QImage.Format.Format_ARGB32_Premultiplied  # drawn 3-8x faster than Indexed8


def test_rendered_cells_show_the_colour_of_their_owner_and_state(widget):
    image = widget.graphics.viewport().grab().toImage()
    c1 = widget.colors.owners.cached(1)
    c2 = widget.colors.owners.cached(2)
    assert c1 is not None and c2 is not None and c1 != c2
    assert pixel(widget, "prefill-0", 3, image) == lut_rgb(widget, BRIGHT_BASE + c1)
    assert pixel(widget, "prefill-0", 12, image) == lut_rgb(widget, BRIGHT_BASE + c2)
    assert pixel(widget, "prefill-0", 3, image) != pixel(widget, "prefill-0", 12, image)
    assert pixel(widget, "prefill-0", 16, image) == lut_rgb(widget, DIM_BASE + c2)  # reserved: dim owner colour
    assert pixel(widget, "prefill-0", 18, image) == lut_rgb(widget, QUARANTINED_PAGE) == THEMES["dark"].quarantined
    assert pixel(widget, "prefill-0", 40, image) == lut_rgb(widget, FREE_PAGE) == THEMES["dark"].free
    # the same request has the same colour in the other pool; in flight is the dim half
    assert pixel(widget, "decode-0", 2, image) == lut_rgb(widget, DIM_BASE + c1)
    assert pixel(widget, "decode-0", 7, image) == lut_rgb(widget, BRIGHT_BASE + c2)


def test_levels_map_every_index_to_its_own_lut_entry(qtbot):
    lut = PageColors("dark").lut()
    item = pg.ImageItem(axisOrder="row-major")
    item.setImage(np.arange(256, dtype=np.uint8).reshape(1, 256), levels=LEVELS, lut=lut, autoLevels=False)
    item.render()
    assert item.qimage.format() == QImage.Format.Format_Indexed8  # the fast path
    got = [item.qimage.pixelColor(x, 0) for x in range(256)]
    assert [(c.red(), c.green(), c.blue()) for c in got] == [tuple(int(v) for v in row[:3]) for row in lut]


def test_a_delta_repaints_only_what_changed(widget, state):
    before = pixel(widget, "prefill-0", 30)
    state.apply(unpack(delta("prefill-0", 2, [30], owner=4, state=WRITTEN, epoch=1, writer=(4 << 32) | 1)))
    widget.refresh()
    assert widget._views["prefill-0"].image.last_update_pages == 1
    assert widget._views["decode-0"].image.last_update_pages == 0
    after = pixel(widget, "prefill-0", 30)
    assert before == lut_rgb(widget, FREE_PAGE)
    assert after == lut_rgb(widget, BRIGHT_BASE + widget.colors.owners.cached(4)) != before


# ---- hover ------------------------------------------------------------------------------

def test_describe_page_names_owner_tenant_state_and_writer(widget):
    text = widget.describe_page("prefill-0", 3)
    for part in ("prefill-0", "page 3 ", "row 0, col 3", "request req-a (slot 1)", "tenant acme", "state WRITTEN",
                 "filled 16/16 tokens", "epoch 2", "writer request req-a (slot 1, epoch 2) (the owner, this epoch)"):
        assert part in text, (part, text)
    free = widget.describe_page("prefill-0", 40)
    assert "owner: none" in free and "state FREE" in free and "never written" in free
    assert "filled" not in free and "last held" not in free  # nothing left in it
    reserved = widget.describe_page("prefill-0", 16)
    assert "request req-b (slot 2)" in reserved and "state RESERVED" in reserved and "filled 0/16" in reserved
    assert "state QUARANTINED" in widget.describe_page("prefill-0", 18)
    assert "slot 9 (request not known)" in widget.describe_page("decode-0", 10)
    with pytest.raises(IndexError):
        widget.describe_page("decode-0", 100)


def test_a_writer_that_is_not_the_owner_is_called_out(widget, state):
    state.apply(unpack(delta("decode-0", 2, [50], owner=2, state=WRITTEN, epoch=5, writer=(1 << 32) | 1)))
    assert ("writer request req-a (slot 1, epoch 1) (NOT the owner's tag for this epoch)"
            in widget.describe_page("decode-0", 50))


def test_a_freed_page_says_what_its_last_owner_left_not_filled(widget, state):
    # issue 15, item 10: a free page read "filled 16/16"; a freed, unscrubbed page keeps tokens
    state.apply(unpack(delta("decode-0", 2, [60], owner=-1, state=FREE, epoch=3, writer=(1 << 32) | 3, filled=16)))
    text = widget.describe_page("decode-0", 60)
    assert "state FREE" in text and "filled 16/16" not in text
    assert "last held 16/16 tokens before it was freed" in text and "writer request req-a (slot 1, epoch 3)" in text


def test_hovering_a_cell_shows_its_description(widget, qtbot):
    with qtbot.waitSignal(widget.page_hovered, timeout=2000) as hovered:
        qtbot.mouseMove(widget.graphics.viewport(), cell_point(widget, "decode-0", 7))
    assert hovered.args[0] == widget.describe_page("decode-0", 7)
    assert "request req-b" in widget.hover_label.full_text()


def test_a_long_hover_line_is_elided_and_never_widens_the_window(qtbot, state):
    """Issue 15, item 4: the hover line was not elided: the window grew 1,400 -> 1,543 px and
    the maps moved under the pointer."""
    from PySide6.QtWidgets import QMainWindow

    window = QMainWindow()
    qtbot.addWidget(window)
    window.setCentralWidget(PageMapWidget(state, theme_name="dark"))
    window.resize(700, 500)
    window.show()
    qtbot.waitExposed(window)
    view = window.centralWidget()
    long_line = "request req-b · tenant acme · " + " · ".join(f"field{i} value{i}" for i in range(60))
    view.hover_label.setText(long_line)
    qtbot.wait(50)
    assert window.width() == 700
    assert view.hover_label.full_text() == long_line and view.hover_label.toolTip() == long_line
    shown = view.hover_label.text()
    assert shown.endswith("…") and long_line.startswith(shown[:-1])
    assert view.hover_label.fontMetrics().horizontalAdvance(shown) <= view.hover_label.width()


# ---- selection ---------------------------------------------------------------------------

def click(widget, qtbot, pool: str, page: int) -> None:
    qtbot.mouseClick(widget.graphics.viewport(), Qt.LeftButton, pos=cell_point(widget, pool, page))


def test_click_selects_the_request_and_highlights_it_in_every_pool(widget, qtbot, state):
    base = {(p, page): pixel(widget, p, page) for p, page in [("prefill-0", 3), ("prefill-0", 12), ("decode-0", 2),
                                                               ("decode-0", 7), ("prefill-0", 40), ("prefill-0", 18)]}
    with qtbot.waitSignal(widget.request_selected, timeout=2000) as selected:
        click(widget, qtbot, "decode-0", 2)  # an in-flight page of req-a
    assert selected.args == ["req-a"]
    assert state.selected_request == "req-a" and widget.selected_slot == 1
    image = widget.graphics.viewport().grab().toImage()
    assert pixel(widget, "prefill-0", 3, image) == base[("prefill-0", 3)]  # req-a: unchanged in both pools
    assert pixel(widget, "decode-0", 2, image) == base[("decode-0", 2)]
    for key in [("prefill-0", 12), ("decode-0", 7), ("prefill-0", 40)]:  # everything else: dimmed
        got, was = pixel(widget, *key, image), base[key]
        assert got == lut_rgb(widget, owner_index(widget, *key), selected_slot=1)
        assert sum(got) < 0.7 * sum(was), (key, got, was)
    assert pixel(widget, "prefill-0", 18, image) == base[("prefill-0", 18)]  # the alarm is never dimmed

    with qtbot.waitSignal(widget.request_selected, timeout=2000) as cleared:
        click(widget, qtbot, "prefill-0", 40)  # a free page clears the selection
    assert cleared.args == [""] and state.selected_request is None and widget.selected_slot is None
    assert all(pixel(widget, *key) == rgb for key, rgb in base.items())


def test_clicking_outside_the_pages_clears_the_selection(widget, qtbot, state):
    widget.select_request("req-b")
    assert widget.selected_slot == 2
    with qtbot.waitSignal(widget.request_selected, timeout=2000) as cleared:
        qtbot.mouseClick(widget.graphics.viewport(), Qt.LeftButton, pos=QPoint(3, 3))
    assert cleared.args == [""] and state.selected_request is None
    with qtbot.assertNotEmitted(widget.request_selected):
        click(widget, qtbot, "decode-0", 10)  # slot 9: no request known, highlighted all the same
    assert widget.selected_slot == 9 and state.selected_request is None
    widget.refresh()
    assert widget.selected_slot == 9


def test_select_request_and_a_selection_made_elsewhere_highlight_without_a_signal(widget, qtbot, state):
    with qtbot.assertNotEmitted(widget.request_selected):
        widget.select_request("req-b")
    c2 = widget.colors.owners.cached(2)
    assert pixel(widget, "prefill-0", 12) == lut_rgb(widget, BRIGHT_BASE + c2)
    assert pixel(widget, "prefill-0", 3) == lut_rgb(widget, owner_index(widget, "prefill-0", 3), selected_slot=2)
    state.selected_request = "req-a"  # e.g. the requests table wrote it
    widget.refresh()
    assert widget.selected_slot == 1
    assert pixel(widget, "prefill-0", 12) == lut_rgb(widget, BRIGHT_BASE + c2, selected_slot=1)
    widget.select_request(None)
    assert pixel(widget, "prefill-0", 12) == lut_rgb(widget, BRIGHT_BASE + c2)


def test_stale_telemetry_and_a_new_engine(widget, state):
    widget.set_stale(True)
    assert all("telemetry stale" in widget._views[n].title.text for n in widget.pool_names)
    widget.set_stale(False)
    assert not any("stale" in widget._views[n].title.text for n in widget.pool_names)
    fresh = EngineState()
    fresh.apply(unpack(keyframe("decode-0", "decode", 100, [(0, 3, 1, WRITTEN, 1)])))
    widget.state = fresh  # slot 1 is another request in another engine
    assert widget.pool_names == ["decode-0"]
    assert "slot 1 (request not known)" in widget.describe_page("decode-0", 0)
    assert pixel(widget, "decode-0", 0) == lut_rgb(widget, BRIGHT_BASE + widget.colors.owners.cached(1))
    widget.state = EngineState()  # an engine with no pools yet: nothing left on screen
    assert widget.pool_names == [] and not widget.graphics.ci.items


# ---- modes and themes ------------------------------------------------------------------------

def test_state_mode_paints_state_colours(widget):
    widget.set_color_mode("state")
    assert widget.mode_box.currentText() == "State"
    image = widget.graphics.viewport().grab().toImage()
    assert pixel(widget, "prefill-0", 3, image) == pixel(widget, "prefill-0", 12, image) == THEMES["dark"].states[2]
    assert pixel(widget, "prefill-0", 16, image) == THEMES["dark"].states[0]
    assert pixel(widget, "decode-0", 2, image) == THEMES["dark"].states[1]
    assert pixel(widget, "prefill-0", 18, image) == THEMES["dark"].quarantined
    widget.select_request("req-b")
    assert pixel(widget, "prefill-0", 12) == THEMES["dark"].states[2]
    assert sum(pixel(widget, "prefill-0", 3)) < 0.7 * sum(THEMES["dark"].states[2])
    assert pixel(widget, "prefill-0", 3) == lut_rgb(widget, STATE_BASE + WRITTEN, selected_slot=2)


def test_tenant_mode_gives_one_colour_per_tenant(widget, qtbot):
    with qtbot.waitSignal(widget.color_mode_changed, timeout=1000) as changed:
        widget.mode_box.setCurrentIndex(1)  # the combo box drives the same setter
    assert changed.args == ["tenant"] and widget.color_mode == "tenant"
    image = widget.graphics.viewport().grab().toImage()
    acme, globex = pixel(widget, "prefill-0", 3, image), pixel(widget, "prefill-0", 12, image)
    assert acme != globex
    assert pixel(widget, "decode-0", 2, image) == lut_rgb(widget, DIM_BASE + widget.colors.tenants.of_tenant["acme"])
    assert pixel(widget, "decode-0", 10, image) == lut_rgb(widget, NEUTRAL)  # slot 9: tenant unknown -> neutral
    with pytest.raises(ValueError):
        widget.set_color_mode("rainbow")


def padding_pixel(w: PageMapWidget, image: QImage) -> tuple[int, int, int]:
    """Colour of a no-page cell: decode-0 has 100 pages in 7 rows of 16, row 6 ends at col 3."""
    c = image.pixelColor(w.graphics.mapFromScene(w._views["decode-0"].item.mapToScene(QPointF(10.5, 6.5))))
    return c.red(), c.green(), c.blue()


@pytest.mark.parametrize("name", ["light", "dark"])
def test_theme_sets_the_reserved_colours_and_the_plot_background(widget, name):
    widget.set_theme("light" if name == "dark" else "dark")
    widget.set_theme(name)
    image = widget.graphics.viewport().grab().toImage()
    assert pixel(widget, "prefill-0", 40, image) == THEMES[name].free
    assert pixel(widget, "prefill-0", 18, image) == THEMES[name].quarantined
    background = QColor(theme.plot_colors(name)[0])
    assert padding_pixel(widget, image) == (background.red(), background.green(), background.blue())


def test_screenshot(qtbot, tmp_path):
    """A realistic map saved as PNG (PAGE_MAP_PNG names the file to keep) and checked."""
    rng = np.random.default_rng(3)
    s = EngineState()
    for name, role, n in (("prefill-0", "prefill", 4096), ("decode-0", "decode", 8192)):
        runs, page, slot = [], 0, 1
        while page < n * 0.8:
            k = int(rng.integers(20, 400))
            written = int(k * rng.uniform(0.6, 1.0))
            runs.append((page, page + written - 1, slot, WRITTEN, 1))
            if written < k:
                runs.append((page + written, page + k - 1, slot, RESERVED if role == "prefill" else IN_FLIGHT, 1))
            page += k + int(rng.integers(0, 120))
            slot += 1
        runs.append((777, 779, 5, QUARANTINED, 2))
        s.apply(unpack(keyframe(name, role, n, runs)))
    for slot in range(1, 60):
        s.apply(unpack(pack({"topic": "requests", "request_id": f"req-{slot}", "slot": slot,
                             "tenant": ("acme", "globex", "initech")[slot % 3], "phase": "decoding"})))
    w = PageMapWidget(s, theme_name="dark")
    qtbot.addWidget(w)
    w.setPalette(theme.build_palette("dark"))
    w.resize(1100, 560)
    w.show()
    w.refresh()
    qtbot.waitExposed(w)
    path = Path(os.environ.get("PAGE_MAP_PNG") or tmp_path / "page_map.png")
    assert w.grab().save(str(path))
    shot = QImage(str(path))
    assert (shot.width(), shot.height()) == (1100, 560)
    colours = {shot.pixel(x, y) for x in range(0, 1100, 7) for y in range(40, 520, 7)}
    assert len(colours) > 40  # many owners, not a blank or single-colour map


def test_the_legend_keys_canaries_and_in_tenant_mode_each_tenant(widget):
    # issue 15, item 10: canary pages were drawn but not keyed; tenant colours had no key
    assert "canary" in widget.legend.text() and "acme" not in widget.legend.text()
    widget.set_color_mode("tenant")
    widget.refresh()
    legend = widget.legend.text()
    lut = widget.colors.lut()
    assert list(widget.colors.tenants.of_tenant) == ["acme", "globex"]  # initech's one page is quarantined
    for tenant in ("acme", "globex"):
        r, g, b = (int(v) for v in lut[BRIGHT_BASE + widget.colors.tenants.of_tenant[tenant], :3])
        assert f"color:#{r:02x}{g:02x}{b:02x}'>■</span>&nbsp;{tenant}" in legend, legend
    assert "canary" in legend
    widget.set_color_mode("state")
    assert "acme" not in widget.legend.text()


def test_a_selected_request_that_holds_no_pages_is_named_with_a_way_out(widget, state, qtbot):
    # issue 15, item 9: selecting a request that then finished dimmed the map with no indication
    widget.select_request("req-d")
    widget.refresh()
    assert widget.selection_note.isHidden() and not widget.clear_selection_button.isHidden()  # it holds page 11
    state.apply(unpack(delta("decode-0", 2, [11], owner=-1, state=FREE, epoch=2)))
    state.apply(unpack(pack({"topic": "requests", "seq": 9, "request_id": "req-d", "slot": 4, "tenant": "initech",
                             "phase": "finished"})))
    widget.refresh()
    assert not widget.selection_note.isHidden()
    assert "Selected request req-d (finished) holds no pages now" in widget.selection_note.text()
    widget.clear_selection_button.click()
    widget.refresh()
    assert state.selected_request is None and widget.selected_slot is None
    assert widget.selection_note.isHidden() and widget.clear_selection_button.isHidden()


def test_wheel_zoom_and_drag_pan_keep_clicks_exact_and_fit_shows_every_page(widget, qtbot, state):
    """Large pools (issue 15, "zoom and pan"): zoomed in, a click still selects the page under
    the pointer; Fit shows every page of every pool again."""
    view = widget._views["prefill-0"].view
    whole = [list(r) for r in view.viewRange()]
    view.scaleBy((0.25, 0.25), center=widget._views["prefill-0"].item.mapToView(QPointF(3.5, 0.5)))
    qtbot.wait(50)
    zoomed = view.viewRange()
    assert zoomed[0][1] - zoomed[0][0] < 0.5 * (whole[0][1] - whole[0][0])
    with qtbot.waitSignal(widget.request_selected, timeout=2000) as selected:
        click(widget, qtbot, "prefill-0", 3)  # req-a's page, under the zoom
    assert selected.args == ["req-a"]
    widget.fit_all()
    qtbot.wait(50)
    rows, cols = widget._views["prefill-0"].image.image.shape
    (x0, x1), (y0, y1) = view.viewRange()
    assert x0 <= 0 and x1 >= cols and y0 <= 0 and y1 >= rows  # the whole pool again


def test_the_requests_table_carries_each_requests_map_colour(widget, qtbot, state):
    """The colour key (issue 15, "a legend of request/tenant colours"): each request's row in
    the table shows the colour its pages have in the map, by request and by tenant."""
    from gui.widgets.requests_table import RequestsTable

    table = RequestsTable(state)
    qtbot.addWidget(table)
    table.model.colour_of = lambda row: widget.swatch_of(row.slot)
    table.filter.setCurrentIndex(1)  # all
    widget.refresh()

    def swatch(rid):
        row = table.model.row_of(rid)
        return table.model.data(table.model.index(row, 0), Qt.DecorationRole)

    shown = swatch("req-a")
    assert shown is not None
    assert (shown.red(), shown.green(), shown.blue()) == lut_rgb(widget, owner_index(widget, "prefill-0", 3))
    assert swatch("req-a") != swatch(next(r for r in state.requests if r != "req-a"))
    widget.set_color_mode("state")
    assert swatch("req-a") is None  # state mode: pages are coloured by state, not owner
