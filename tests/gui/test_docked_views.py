"""A telemetry topic's GUI side is one file: a view that declares a Dock is found and placed by
the window (no edit to main_window.py), and a topic nobody wrote a view for still shows in
the Telemetry inspector."""

from __future__ import annotations

import importlib.util
import textwrap

import pytest
from PySide6.QtWidgets import QDockWidget

from engine.wire.protocol import Message, pack, unpack
from gui.main_window import MainWindow
from gui.widgets import state_view
from gui.widgets.telemetry_inspector import TelemetryInspector, arrived_text

NEW_VIEW = '''
"""KvHitsView: the `kv_hits` topic, the way a new view module is written (one file)."""

from PySide6.QtWidgets import QLabel

from gui.model.topic_log import topic_event
from gui.widgets.state_view import Dock, StateView


class KvHitsView(StateView, QLabel):
    dock = Dock("KV hits", area="bottom")

    def __init__(self, state, parent=None):
        super().__init__(parent)
        self.refreshes = 0
        self.state = state

    def follows(self):
        return {topic_event("kv_hits"): self.refresh}

    def refresh(self):
        self.refreshes += 1
        payload = self.state.topics.payload("kv_hits") or {}
        self.setText(f"{payload.get('hits', 0)} hits")
'''


@pytest.fixture
def new_view_module(tmp_path, monkeypatch):
    """A view module nobody imports by name, loaded as the window's discovery would load one."""
    monkeypatch.setattr(state_view, "DOCKED", list(state_view.DOCKED))  # registered for this test only
    path = tmp_path / "kv_hits_view.py"
    path.write_text(textwrap.dedent(NEW_VIEW))
    spec = importlib.util.spec_from_file_location("kv_hits_view", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def window(qtbot):
    windows = []

    def open_() -> MainWindow:
        w = MainWindow(theme="dark")
        qtbot.addWidget(w)
        windows.append(w)
        return w

    yield open_
    for w in windows:
        w.close()


def message(header: dict) -> Message:
    return unpack(pack(header))


def test_a_view_declared_in_a_new_module_is_placed_without_touching_the_window(new_view_module, window):
    w = window()
    view_class = new_view_module.KvHitsView
    dock = w.docked_views[view_class]
    view = dock.widget()
    assert isinstance(view, view_class) and dock.windowTitle() == "KV hits"
    assert w.dockWidgetArea(dock) == w.dockWidgetArea(w.findChild(QDockWidget, "Requests and alerts"))
    assert "KV hits" in [a.text() for a in w.view_menu.actions()]
    w.on_telemetry([message({"topic": "kv_hits", "seq": 1, "hits": 7})])
    w.refresh()
    assert view.refreshes == 1 and view.text() == "7 hits"
    w.state = w._fresh_state()  # a new engine: the placed view follows its state like any other
    w.on_telemetry([message({"topic": "kv_hits", "seq": 1, "hits": 9})])
    w.refresh()
    assert view.text() == "9 hits"


def test_the_inspector_shows_an_unknown_topics_payload(window, qtbot):
    w = window()
    w.show()
    dock = w.docked_views[TelemetryInspector]
    inspector = dock.widget()
    assert dock.isHidden()  # out of the way until asked for
    w.on_telemetry([message({"topic": "kv_hits", "seq": 3, "hits": 5, "by_tenant": {"acme": 4, "beta": 1},
                             "recent": list(range(80))})])
    w.refresh()
    assert inspector.item_of("kv_hits") is None  # hidden: nothing built
    next(a for a in w.view_menu.actions() if a.text() == "Telemetry").trigger()
    qtbot.waitUntil(inspector.isVisible, timeout=5_000)
    item = inspector.item_of("kv_hits")
    assert item is not None and item.text(0) == "kv_hits" and item.text(3) == "1"
    assert item.text(2) == arrived_text(w.state.topics.latest["kv_hits"].wall)  # when it arrived, to the ms
    fields = {item.child(i).text(0): item.child(i) for i in range(item.childCount())}
    assert fields["hits"].text(1) == "5" and fields["by_tenant"].text(1) == "{2 fields}"
    tenants = fields["by_tenant"]
    assert {tenants.child(i).text(0): tenants.child(i).text(1) for i in range(tenants.childCount())} == \
        {"acme": "4", "beta": "1"}
    recent = fields["recent"]
    assert recent.text(1) == "[80 items]" and recent.childCount() == 51 and recent.child(50).text(0) == "… 30 more"
    tenants.setExpanded(True)
    w.on_telemetry([message({"topic": "kv_hits", "seq": 4, "hits": 6, "by_tenant": {"acme": 6}})])
    w.refresh()
    item = inspector.item_of("kv_hits")
    fields = {item.child(i).text(0): item.child(i) for i in range(item.childCount())}
    assert fields["hits"].text(1) == "6" and item.text(3) == "2" and fields["by_tenant"].isExpanded()
    w.on_telemetry([message({"topic": "metrics", "seq": 1, "tokens_per_s": 3.0})])  # a known topic is listed too
    w.refresh()
    names = [inspector.tree.topLevelItem(i).text(0) for i in range(inspector.tree.topLevelItemCount())]
    assert names == ["kv_hits", "metrics"]
    assert "2 topics" in inspector.caption.text()
