"""show_page_map: a PageMapWidget over a state, shown and painted once (page map tests)."""

from __future__ import annotations

from gui.widgets.page_map import PageMapWidget


def show_page_map(qtbot, state, size=(900, 520)) -> PageMapWidget:
    widget = PageMapWidget(state, theme_name="dark")
    qtbot.addWidget(widget)
    widget.resize(*size)
    widget.show()
    widget.refresh()
    qtbot.waitExposed(widget)
    return widget
