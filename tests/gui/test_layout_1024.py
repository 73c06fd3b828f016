"""Issue 15, item 8: the window at 1024x700 against a real engine under load. The metric
plots kept no height, the workers table lost its usage column, the pool legend covered
its plot, a queue of 0 read "requests (x0.001)", and an 83-page pool flipped between a
square crop and the whole strip as the window resized."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from PySide6.QtWidgets import QApplication

from engine.wire.protocol import unpack
from gui.model.engine_state import EngineState
from gui.widgets.page_map import PageMapWidget
from gui.widgets.workers_panel import (
    MIN_COLUMN_WIDTH,
    USAGE_COLUMN,
    USAGE_MIN_WIDTH,
    WIDTHS,
    WorkersPanel,
    column_widths,
)
from tests.gui.test_page_map import WRITTEN, keyframe

SIZE = (1024, 700)
MIN_DATA_HEIGHT = 40  # px of curves per metric plot, below its title and axis
MIN_PLOT_HEIGHT = 60


def settle(qtbot, seconds: float = 0.3) -> None:
    qtbot.wait(int(seconds * 1000))
    QApplication.processEvents()


def pool_ranges(page_map: PageMapWidget) -> dict[str, tuple]:
    """Each pool's visible range, rounded to a tenth of a cell."""
    return {name: tuple(tuple(round(v, 1) for v in axis) for axis in view.view.viewRange())
            for name, view in page_map._views.items()}


def assert_whole_pools_inside(page_map: PageMapWidget) -> None:
    width = page_map.graphics.viewport().width()
    for name, view in page_map._views.items():
        (x0, x1), (y0, y1) = view.view.viewRange()
        rows, cols = view.image.image.shape
        assert x0 <= 0 and x1 >= cols and y0 <= 0 and y1 >= rows, (name, view.view.viewRange(), (rows, cols))
        box = view.view.sceneBoundingRect()
        assert box.left() >= 0 and box.right() <= width + 1, (name, box, width)


def test_the_window_at_1024x700_keeps_every_view_usable(start_server, open_window, qtbot):
    server = start_server(pools={"prefill": {"pages": 83}, "decode": {"pages": 512}})
    window = open_window(server.control)
    hint = window.minimumSizeHint()
    assert hint.width() <= SIZE[0] and hint.height() <= SIZE[1], hint
    window.resize(*SIZE)
    window.toggle_demo(True)  # load: curves, used pages, rows in the tables
    qtbot.waitUntil(lambda: len(window.state.requests) >= 3, timeout=60_000)
    settle(qtbot, 3.0)
    assert window.size().width() == SIZE[0] and window.size().height() == SIZE[1]

    for name, plot in window.metrics.plots.items():
        assert plot.geometry().height() >= MIN_PLOT_HEIGHT, (name, plot.geometry())
        assert plot.getViewBox().geometry().height() >= MIN_DATA_HEIGHT, (name, plot.getViewBox().geometry())
        axis = plot.getAxis("left")
        assert "x0.001" not in axis.labelString() and axis.autoSIPrefixScale == 1.0, (name, axis.labelString())
        low, high = plot.viewRange()[1]
        assert -0.05 * high <= low <= 0 < high, (name, low, high)  # pool usage pads 0..100 by 2
    usage = window.metrics.plots["pool_usage"].getViewBox()
    legend = window.metrics.legend
    legend_rect = legend.mapRectToScene(legend.boundingRect())
    assert not usage.mapRectToScene(usage.boundingRect()).intersects(legend_rect)
    assert legend_rect.right() <= window.metrics.graphics.viewport().width(), "the legend is cut"
    assert sorted(label.text for _sample, label in legend.items) == ["decode-0", "prefill-0"]

    view = window.workers_panel.view
    right = view.columnViewportPosition(USAGE_COLUMN) + view.columnWidth(USAGE_COLUMN)
    assert view.columnWidth(USAGE_COLUMN) >= USAGE_MIN_WIDTH and right <= view.viewport().width() + 1

    page_map = window.page_map
    assert_whole_pools_inside(page_map)
    shapes = set()
    for i in range(12):  # resizes and refreshes must not change what an 83-page pool shows
        window.resize(SIZE[0] + (i % 2), SIZE[1])
        settle(qtbot, 0.15)
        window.resize(*SIZE)
        settle(qtbot, 0.15)
        page_map.refresh()
        QApplication.processEvents()
        shapes.add(pool_ranges(page_map)["prefill-0"])
    assert len(shapes) == 1, shapes
    assert_whole_pools_inside(page_map)

    window.toggle_demo(False)
    shot = os.environ.get("LAYOUT_PNG")  # docs/screenshot-layout-1024x700.png is made this way
    if shot:
        assert window.grab().save(str(Path(shot)))


@pytest.mark.parametrize("size", [(420, 260), (420, 330), (300, 400), (250, 500), (600, 200), (900, 300)])
def test_an_83_page_pool_shows_whole_in_any_box_and_keeps_it_across_refreshes(qtbot, size):
    """The pan limits were three rows tall: a box taller than the strip showed a square crop."""
    state = EngineState()
    state.apply(unpack(keyframe("prefill-0", "prefill", 83, [(0, 9, 1, WRITTEN, 2)])))
    state.apply(unpack(keyframe("decode-0", "decode", 512, [(0, 400, 2, WRITTEN, 2)])))
    page_map = PageMapWidget(state, theme_name="dark")
    qtbot.addWidget(page_map)
    page_map.resize(*size)
    page_map.show()
    page_map.refresh()
    settle(qtbot, 0.1)
    first = pool_ranges(page_map)
    assert_whole_pools_inside(page_map)
    for used in (0, 5, 40, 83, 12):  # titles of another length must not move the columns
        state.apply(unpack(keyframe("prefill-0", "prefill", 83, [(0, used - 1, 1, WRITTEN, 2)] if used else [],
                                    seq=10 + used)))
        page_map.refresh()
        QApplication.processEvents()
        assert pool_ranges(page_map) == first
    assert_whole_pools_inside(page_map)


def test_column_widths_keep_the_usage_column_and_shrink_the_others():
    wide = column_widths(800)
    assert wide[:USAGE_COLUMN] == list(WIDTHS[:USAGE_COLUMN]) and sum(wide) == 800
    for available in (420, 300, 260):
        widths = column_widths(available)
        assert widths[USAGE_COLUMN] >= USAGE_MIN_WIDTH and sum(widths) <= available + len(widths)
        assert all(w >= MIN_COLUMN_WIDTH for w in widths)


def test_a_narrow_workers_panel_still_shows_the_usage_column(qtbot):
    panel = WorkersPanel(EngineState())
    qtbot.addWidget(panel)
    panel.resize(330, 160)
    panel.show()
    settle(qtbot, 0.1)
    view = panel.view
    right = view.columnViewportPosition(USAGE_COLUMN) + view.columnWidth(USAGE_COLUMN)
    assert view.columnWidth(USAGE_COLUMN) >= USAGE_MIN_WIDTH and right <= view.viewport().width() + 1
