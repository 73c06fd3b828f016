"""Engines that share pages (vLLM's prefix cache, through the PageWarden agent): the `refs`
page array marks shared pages on the map, keys them in the legend and names them on hover;
a status whose engine map says `read_only` makes the window read-only while attached."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QImage

from engine.client.page_mirror import PageMirror
from engine.wire.protocol import Message, pack, page_arrays, unpack
from gui import theme
from gui.main_window import MainWindow
from gui.model.engine_state import EngineState
from gui.model.page_grid import SHARED_EDGE, SHARED_STRIPE, shared_cells_of
from gui.model.page_history import PageHistory
from gui.model.snapshot_state import state_from_snapshot
from gui.snapshot.bundle import _pages, pages_npz
from gui.widgets.page_map import PageMapWidget
from tests.gui.page_map_widget import show_page_map

FREE, RESERVED, IN_FLIGHT, WRITTEN = 0, 1, 2, 3
POOL = "vllm"
NUM_PAGES = 480  # hundreds of pages, as a small vLLM pool
ENGINE_NAME = "vLLM 0.32.0 (PageWarden agent)"


def vllm_pool() -> dict[str, np.ndarray]:
    """Ten requests; 1-4 share a 6-page system prompt (pages 0-5, refs 4), 5 and 6 share a
    3-page prefix (pages 40-42, refs 2); each holds pages of its own from page 60 on."""
    n = NUM_PAGES
    m = {"owner": np.full(n, -1, np.int32), "epoch": np.ones(n, np.int64), "writer": np.full(n, -1, np.int64),
         "filled": np.zeros(n, np.int32), "state": np.zeros(n, np.uint8), "refs": np.zeros(n, np.int32)}

    def hold(pages, slot, refs, state=WRITTEN):
        m["owner"][pages], m["state"][pages], m["refs"][pages] = slot, state, refs
        m["filled"][pages] = 16 if state == WRITTEN else 0
        if state == WRITTEN:
            m["writer"][pages] = (slot << 32) | 1

    hold(slice(0, 6), 1, 4)
    hold(slice(40, 43), 5, 2)
    page = 60
    for slot in range(1, 11):
        k = 5 + 3 * slot
        hold(slice(page, page + k - 2), slot, 1)
        hold(slice(page + k - 2, page + k), slot, 1, RESERVED)
        page += k
    return m


SHARED = [0, 1, 2, 3, 4, 5, 40, 41, 42]


def keyframe(arrays: dict, pool: str = POOL, role: str = "vllm", seq: int = 1) -> Message:
    header = {"topic": f"pages/{pool}", "pool": pool, "role": role, "kind": "keyframe", "seq": seq,
              "num_pages": len(arrays["owner"]), "page_size": 16}
    return unpack(pack(header, page_arrays(arrays)))


def requests() -> list[Message]:
    return [unpack(pack({"topic": "requests", "seq": slot, "request_id": f"chat-{slot}", "slot": slot,
                         "tenant": "vllm", "phase": "decoding", "prompt_len": 100})) for slot in range(1, 11)]


@pytest.fixture
def state() -> EngineState:
    s = EngineState()
    s.apply(keyframe(vllm_pool()))
    for msg in requests():
        s.apply(msg)
    return s


@pytest.fixture
def widget(qtbot, state) -> PageMapWidget:
    return show_page_map(qtbot, state, (900, 560))


def cell_colours(w: PageMapWidget, page: int, image: QImage) -> set[tuple[int, int, int]]:
    """Every colour drawn inside a page's cell (its inner 80%)."""
    view = w._views[POOL]
    row, col = view.image.grid.cell_of(page)
    graphics = w.graphics
    corner = graphics.mapFromScene(view.item.mapToScene(col + 0.1, row + 0.1))
    far = graphics.mapFromScene(view.item.mapToScene(col + 0.9, row + 0.9))
    return {image.pixelColor(x, y).getRgb()[:3] for x in range(corner.x(), far.x() + 1)
            for y in range(corner.y(), far.y() + 1)}


# ---- the marker -------------------------------------------------------------------------

def test_shared_pages_get_the_marker_and_no_other_page_does(widget, state):
    view = widget._views[POOL]
    assert view.shared_pages.tolist() == SHARED == state.pages.pools[POOL].shared_pages().tolist()
    assert view.shared.isVisible()
    overlay = view.shared.image
    assert shared_cells_of(view.image.grid, overlay).tolist() == SHARED  # the pixels say the same
    rect = view.shared.mapRectToView(view.shared.boundingRect())
    assert (rect.width(), rect.height()) == (view.image.grid.cols, view.image.grid.rows)  # over the cells
    image = widget.graphics.viewport().grab().toImage()
    stripe, edge = SHARED_STRIPE[:3], SHARED_EDGE[:3]
    for page in (0, 5, 41):
        colours = cell_colours(widget, page, image)
        assert stripe in colours and edge in colours, (page, colours)
    for page in (6, 39, 43, 60, 300):  # free, or held by one request: plain
        colours = cell_colours(widget, page, image)
        assert stripe not in colours and edge not in colours, (page, colours)
    assert "9 shared" in view.title_text


def test_the_marker_follows_deltas_in_every_colour_mode(widget, state):
    view = widget._views[POOL]
    arrays = {k: v.copy() for k, v in state.pages.pools[POOL].arrays.items()}
    index = np.array([0, 1, 2, 100])
    arrays["refs"][index] = [1, 1, 1, 2]
    header = {"topic": f"pages/{POOL}", "pool": POOL, "kind": "delta", "seq": 2}
    state.apply(unpack(pack(header, page_arrays(arrays, index))))
    for mode in ("request", "tenant", "state"):
        widget.set_color_mode(mode)
        widget.refresh()
        assert view.shared_pages.tolist() == [3, 4, 5, 40, 41, 42, 100], mode
        assert view.shared.isVisible() and view.shared.zValue() > view.item.zValue()
        assert shared_cells_of(view.image.grid, view.shared.image).tolist() == [3, 4, 5, 40, 41, 42, 100]
    arrays["refs"][:] = np.minimum(arrays["refs"], 1)
    state.apply(unpack(pack({**header, "seq": 3}, page_arrays(arrays, np.arange(NUM_PAGES)))))
    widget.refresh()
    assert view.shared_pages.tolist() == [] and not view.shared.isVisible()


def test_the_legend_keys_shared_pages_only_when_a_pool_sends_refs(qtbot, state):
    plain = EngineState()
    arrays = vllm_pool()
    del arrays["refs"]
    plain.apply(keyframe(arrays, pool="decode-0", role="decode"))
    w = PageMapWidget(plain, theme_name="dark")
    qtbot.addWidget(w)
    w.refresh()
    assert "shared (prefix cache)" not in w.legend.text()
    assert w._views["decode-0"].shared_pages.tolist() == [] and not w._views["decode-0"].shared.isVisible()
    assert "shared by" not in w.describe_page("decode-0", 0)
    w.state = state  # another engine: the vLLM agent
    w.refresh()
    assert "shared (prefix cache)" in w.legend.text()
    for mode in ("tenant", "state", "request"):
        w.set_color_mode(mode)
        w.refresh()
        assert "shared (prefix cache)" in w.legend.text(), mode


def test_the_hover_text_says_how_many_requests_share_the_page(widget, qtbot):
    assert "shared by 2 requests" in widget.describe_page(POOL, 41)
    assert "shared by 4 requests" in widget.describe_page(POOL, 0)
    assert "shared by" not in widget.describe_page(POOL, 60)
    assert "shared by" not in widget.describe_page(POOL, 400)
    with qtbot.waitSignal(widget.page_hovered, timeout=2000) as hovered:
        qtbot.mouseMove(widget.graphics.viewport(), widget.graphics.mapFromScene(widget.scene_pos_of(POOL, 41)))
    assert "shared by 2 requests" in hovered.args[0]
    assert "shared by 2 requests" in widget.hover_label.full_text()


def test_the_history_and_a_snapshot_keep_refs(widget, state):
    history = PageHistory(interval_s=0.0)
    assert history.record(state.pages, lambda slot: None, now=1.0)
    frame = history.frame(-1)
    assert frame.pools[POOL].shared_pages().tolist() == SHARED
    widget.show_frame(frame)
    assert widget._views[POOL].shared_pages.tolist() == SHARED
    assert "shared by 4 requests" in widget.describe_page(POOL, 3)
    widget.show_frame(None)
    # pages.npz carries refs; the state rebuilt from it too
    pages = {POOL: {k: v.copy() for k, v in state.pages.pools[POOL].arrays.items()}}
    warnings: list[str] = []
    read = _pages(pages_npz(pages), warnings)
    assert not warnings and read[POOL]["refs"].tolist() == pages[POOL]["refs"].tolist()
    opened = SimpleNamespace(state={"pools": [{"name": POOL, "role": "vllm", "page_size": 16}]}, manifest={},
                             pages=read, events=[])
    rebuilt, problems = state_from_snapshot(opened)
    assert not problems and rebuilt.pages.pools[POOL].shared_pages().tolist() == SHARED
    # a bundle of an engine without refs still reads
    plain = {POOL: {k: v for k, v in pages[POOL].items() if k != "refs"}}
    read = _pages(pages_npz(plain), warnings)
    assert not warnings and "refs" not in read[POOL]
    assert PageMirror().apply(keyframe(read[POOL]))


# ---- read-only engines --------------------------------------------------------------------

class FakeTransport(QObject):
    """What MainWindow.attach needs of a TransportThread; remembers the requests it was asked."""

    telemetry = Signal(list)
    status = Signal(dict)
    reply = Signal(int, str, object)
    stream_event = Signal(object)
    connection = Signal(str)

    def __init__(self, endpoint: str):
        super().__init__()
        self.endpoint, self.server_key, self.client_keys, self.telemetry_override = endpoint, None, None, None
        self.sent: list[str] = []

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def request(self, op: str, **fields) -> int:
        self.sent.append(op)
        return len(self.sent)


def agent_status(read_only: bool | None = True, name: str | None = ENGINE_NAME) -> dict:
    engine = {"version": "0.9", "control": "tcp://127.0.0.1:5555", "started": 1.0}
    if read_only is not None:
        engine["read_only"] = read_only
    if name is not None:
        engine["name"] = name
    return {"engine": engine, "config": {}, "capacity": [],
            "workers": [{"name": "vllm", "role": "vllm", "state": "ready",
                         "pool": {"name": POOL, "pages": NUM_PAGES, "page_size": 16}}]}


def control_actions(window: MainWindow) -> list:
    return [a for a in window.actions() if a.property("control")]


def attach(window: MainWindow, endpoint: str) -> FakeTransport:
    transport = FakeTransport(endpoint)
    window.attach(transport, endpoint, hosted=True)
    transport.connection.emit("connected")  # as the transport thread says it
    window.refresh()
    return transport


@pytest.fixture
def window(qtbot):
    windows = []

    def open_(readonly: bool = False) -> MainWindow:
        w = MainWindow(readonly=readonly, theme="dark")
        qtbot.addWidget(w)
        windows.append(w)
        return w

    yield open_
    for w in windows:
        w.close()


def test_a_read_only_engine_disables_the_controls_until_the_window_leaves_it(window):
    w = window()
    first = attach(w, "tcp://127.0.0.1:5555")
    w.on_status(agent_status(read_only=False, name=None))
    w.refresh()
    actions = control_actions(w)
    assert {a.text() for a in actions} >= {"&Demo load", "&Reconfigure…", "Fire a &canary"}
    assert all(a.isEnabled() for a in actions) and w.windowTitle() == f"PageWarden — hosted engine {w.source.now.label}"

    w.on_status(agent_status())  # the vLLM agent
    w.refresh()
    assert w.engine_readonly and w.effective_readonly and not w.readonly  # the user's choice is kept
    assert not any(a.isEnabled() for a in actions)
    assert "read-only" in w.windowTitle() and ENGINE_NAME in w.windowTitle()
    assert w.workers_panel._readonly and w.alerts_table._readonly and w.banner._readonly
    assert w.status_line.readonly_label.isVisibleTo(w.status_line)
    assert w.status_line.name_label.text() == ENGINE_NAME
    first.sent.clear()
    assert w.request("canary") is None and w.request("submit", prompt="x") is None
    assert w.request("keyframe") is not None and first.sent == ["keyframe"]  # viewer ops still go
    w.toggle_demo(True)
    assert w.demo is None and not w.demo_action.isChecked()
    w.open_reconfigure()
    assert getattr(w, "reconfigure_dialog", None) is None

    w.on_status({"workers": [], "capacity": []})  # a brief status without the engine map: still read-only
    w.refresh()
    assert w.engine_readonly and not any(a.isEnabled() for a in actions)

    w.on_status(agent_status(read_only=False, name="PageWarden 0.9"))  # the same address, now our engine
    w.refresh()
    assert not w.engine_readonly and all(a.isEnabled() for a in actions)
    assert w.windowTitle() == f"PageWarden — hosted engine {w.source.now.label}" and not w.workers_panel._readonly
    assert not w.status_line.readonly_label.isVisibleTo(w.status_line)

    w.on_status(agent_status())  # read-only again, then another engine is attached
    w.refresh()
    assert not any(a.isEnabled() for a in actions)
    attach(w, "tcp://127.0.0.1:6666")
    assert not w.engine_readonly and all(a.isEnabled() for a in actions) and w.windowTitle() == f"PageWarden — hosted engine {w.source.now.label}"
    assert w.request("canary") is not None


def test_a_user_readonly_window_stays_read_only_after_a_read_only_engine(window):
    w = window(readonly=True)
    attach(w, "tcp://127.0.0.1:5555")
    actions = control_actions(w)
    assert not any(a.isEnabled() for a in actions) and w.windowTitle() == f"PageWarden — hosted engine {w.source.now.label} — read-only"
    w.on_status(agent_status())
    w.refresh()
    assert not any(a.isEnabled() for a in actions) and ENGINE_NAME in w.windowTitle()
    w.on_status(agent_status(read_only=False))
    w.refresh()
    assert w.readonly and not any(a.isEnabled() for a in actions) and w.windowTitle() == f"PageWarden — hosted engine {w.source.now.label} — read-only"
    assert w.request("canary") is None
    attach(w, "tcp://127.0.0.1:6666")
    assert not any(a.isEnabled() for a in actions) and w.windowTitle() == f"PageWarden — hosted engine {w.source.now.label} — read-only"


def test_screenshot_of_a_read_only_vllm_window_with_shared_pages(window, qtbot, tmp_path):
    """The window at 1024x700 on the agent's pages: the marker must be visible (SHARED_PAGES_PNG
    names the file to keep)."""
    w = window()
    w.setPalette(theme.build_palette("dark"))
    w.resize(1024, 700)
    w.show()
    attach(w, "tcp://127.0.0.1:5555")
    w.on_status(agent_status())
    w.on_telemetry([keyframe(vllm_pool()), *requests()])
    w.refresh()
    qtbot.waitExposed(w)
    qtbot.wait(100)  # the layout settles (titles of two lines), as it does between frames
    path = Path(os.environ.get("SHARED_PAGES_PNG") or tmp_path / "shared-pages.png")
    assert w.grab().save(str(path))
    shot = QImage(str(path))
    assert (shot.width(), shot.height()) == (1024, 700)
    page_map = w.page_map
    origin = page_map.graphics.mapTo(w, page_map.graphics.rect().topLeft())
    view = page_map._views[POOL]
    row, col = view.image.grid.cell_of(41)
    corner = page_map.graphics.mapFromScene(view.item.mapToScene(col + 0.1, row + 0.1)) + origin
    far = page_map.graphics.mapFromScene(view.item.mapToScene(col + 0.9, row + 0.9)) + origin
    assert far.x() - corner.x() >= 6  # a cell is big enough to see at this size
    colours = {shot.pixelColor(x, y).getRgb()[:3] for x in range(corner.x(), far.x() + 1)
               for y in range(corner.y(), far.y() + 1)}
    assert SHARED_STRIPE[:3] in colours and SHARED_EDGE[:3] in colours
