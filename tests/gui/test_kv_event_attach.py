"""The window attached to vLLM / SGLang KV-event streams: a live test publisher on loopback
(its XPUB lives in a thread of its own, its replay ROUTER in another) and the real window,
offscreen, its real watcher polled on the window's KV-event thread.

No sleeps: the publisher's XPUB says when the subscription arrived, and every check waits
with qtbot.waitUntil (generous timeouts for a loaded 2-core machine)."""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future

import numpy as np
import pytest
from PySide6.QtCore import QPoint, QSettings, Qt
from PySide6.QtWidgets import QDialogButtonBox, QDockWidget

import main
from engine.adapters.kv_attach import KvAttach, check_kv_attach
from engine.adapters.kv_event_decode import KvEventError
from gui.app import App, kv_attach_from_args
from gui.dialogs.kv_attach_dialog import KvAttachDialog
from gui.main_window import MainWindow
from gui.model.page_colors import FREE_PAGE, WRITTEN
from gui.model.source import Kind
from gui.widgets.kv_event_map import WAITING
from tests.kv_event_publisher import KvEventTestPublisher, cleared, removed, stored

WAIT_MS = 60_000
GPU0, GPU1 = "rank 0 · GPU", "rank 1 · GPU"


def h(n: int) -> str:
    return f"{n:016x}"


def chain(first: int, count: int) -> list[int]:
    return list(range(first, first + count))


class PublisherThread:
    """A KvEventTestPublisher owned by a thread of its own: run(fn) calls fn(publisher) there
    and returns a Future, so the GUI thread never touches the XPUB."""

    def __init__(self, **kwargs):
        self._jobs: queue.Queue = queue.Queue()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, args=(kwargs,), daemon=True)
        self._thread.start()
        assert self._ready.wait(30), "the publisher thread did not start"
        if self._error is not None:
            raise self._error

    def _main(self, kwargs) -> None:
        try:
            pub = KvEventTestPublisher(**kwargs)
        except BaseException as exc:  # handed to the constructor
            self._error = exc
            self._ready.set()
            return
        self.endpoint, self.replay_endpoint = pub.endpoint, pub.replay_endpoint
        self._ready.set()
        try:
            while (job := self._jobs.get()) is not None:
                fn, future = job
                try:
                    future.set_result(fn(pub))
                except BaseException as exc:
                    future.set_exception(exc)
        finally:
            pub.close()

    def run(self, fn) -> Future:
        future: Future = Future()
        self._jobs.put((fn, future))
        return future

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(30)


def result(qtbot, future: Future):
    """The future's result, while the Qt event loop (and so the watcher) keeps running."""
    qtbot.waitUntil(future.done, timeout=WAIT_MS)
    return future.result()


@pytest.fixture
def publishers():
    made = []

    def make(**kwargs) -> PublisherThread:
        made.append(PublisherThread(**kwargs))
        return made[-1]

    yield make
    for pub in made:
        pub.close()


@pytest.fixture
def window(qtbot):
    win = MainWindow(theme="dark")
    qtbot.addWidget(win)
    win.show()
    yield win
    win.close()


def attach(qtbot, window: MainWindow, *pubs: PublisherThread) -> None:
    window.attach_kv_events(check_kv_attach([p.endpoint for p in pubs], [p.replay_endpoint for p in pubs]))
    for pub in pubs:
        assert result(qtbot, pub.run(lambda p: p.wait_for_subscriber(60))), f"no subscription reached {pub.endpoint}"


def occupied_slots(window: MainWindow, pool: str) -> list[int]:
    return np.flatnonzero(window.kv_map.pools[pool].mirror.arrays["state"] == WRITTEN).tolist()


def slot_of(window: MainWindow, pool: str, block: int) -> int:
    return next(b.slot for b in window.kv_map.pools[pool].by_slot if b is not None and b.hash == h(block))


def index_at(window: MainWindow, pool: str, slot: int) -> int:
    return int(window.kv_view._views[pool].image.image.reshape(-1)[slot])


def cell_point(qtbot, window: MainWindow, pool: str, slot: int) -> QPoint:
    """The viewport pixel at the middle of a slot's cell, once the layout has placed the map."""
    view = window.kv_view

    def point() -> QPoint:
        return view.graphics.mapFromScene(view.scene_pos_of(pool, slot))
    qtbot.waitUntil(lambda: view.graphics.viewport().rect().contains(point()), timeout=WAIT_MS)
    return point()


def pixel(qtbot, window: MainWindow, pool: str, slot: int) -> tuple[int, int, int]:
    point = cell_point(qtbot, window, pool, slot)
    colour = window.kv_view.graphics.viewport().grab().toImage().pixelColor(point)
    return colour.red(), colour.green(), colour.blue()


def lut_rgb(window: MainWindow, index: int) -> tuple[int, int, int]:
    return tuple(int(v) for v in window.kv_view.colors.lut(None)[index, :3])


def wait_blocks(qtbot, window: MainWindow, pool: str, count: int) -> None:
    """Until the map of `pool` (the model and the image the widget draws) holds `count` blocks."""
    def shown():
        window.refresh()
        views = window.kv_view._views if window.kv_view is not None else {}
        return (pool in window.kv_map.pools and len(occupied_slots(window, pool)) == count
                and pool in views and views[pool].image.used_pages == count)
    qtbot.waitUntil(shown, timeout=WAIT_MS)


# ---- the map follows the stream ----------------------------------------------------------

def test_blocks_fill_the_map_by_lineage_removals_free_gaps_replay_and_clear_empties(qtbot, window, publishers):
    pub = publishers()
    attach(qtbot, window, pub)
    a, b = chain(1, 40), chain(101, 30)  # two prefixes: A (root 1) in three batches, B (root 101) in one
    result(qtbot, pub.run(lambda p: [p.publish([stored(a[:10], None, range(160))]),
                                     p.publish([stored(a[10:20], a[9], range(160))], "vllm-extra"),
                                     p.publish([stored(a[20:], a[19], range(320))]),
                                     p.publish([stored(b, None, range(480))], "vllm-map")]))
    assert window.kv_map is not None
    # vllm-map sends 32-byte hashes: B's blocks are known by those
    b_hashes = [n.to_bytes(32, "big").hex() for n in b]
    wait_blocks(qtbot, window, GPU0, 70)
    model, view = window.kv_map, window.kv_view
    assert view.pool_names == [GPU0]
    assert sorted(blk.hash for blk in model.pools[GPU0].by_slot if blk) == sorted([h(n) for n in a] + b_hashes)
    assert {model.block_at(GPU0, slot_of(window, GPU0, n)).root for n in a} == {h(1)}

    # one colour per lineage: every A block shares one, B another, free slots a third
    a_index = {index_at(window, GPU0, slot_of(window, GPU0, n)) for n in a}
    b_slots = [s for s, blk in enumerate(model.pools[GPU0].by_slot) if blk and blk.hash in b_hashes]
    b_index = {index_at(window, GPU0, s) for s in b_slots}
    assert len(a_index) == len(b_index) == 1 and a_index != b_index and FREE_PAGE not in a_index | b_index
    free_slot = model.pools[GPU0].num_slots - 1
    assert model.block_at(GPU0, free_slot) is None and index_at(window, GPU0, free_slot) == FREE_PAGE
    a_rgb, b_rgb = lut_rgb(window, a_index.pop()), lut_rgb(window, b_index.pop())
    assert pixel(qtbot, window, GPU0, slot_of(window, GPU0, 7)) == a_rgb
    assert pixel(qtbot, window, GPU0, b_slots[3]) == b_rgb != a_rgb
    assert pixel(qtbot, window, GPU0, free_slot) == lut_rgb(window, FREE_PAGE) not in (a_rgb, b_rgb)

    # hover names hash, parent, tokens, medium and root
    text = view.describe_page(GPU0, slot_of(window, GPU0, 12))
    for part in (GPU0, f"hash {h(12)}", f"parent {h(11)}", "16 tokens", "medium GPU", f"root {h(1)}",
                 "lineage of 40 blocks"):
        assert part in text, (part, text)
    assert "parent none" in view.describe_page(GPU0, slot_of(window, GPU0, 1))
    assert view.describe_page(GPU0, free_slot).endswith("free")
    point = cell_point(qtbot, window, GPU0, slot_of(window, GPU0, 12))
    with qtbot.waitSignal(view.page_hovered, timeout=5_000) as hovered:
        qtbot.mouseMove(view.graphics.viewport(), point)
    assert f"hash {h(12)}" in hovered.args[0] and h(12) in view.hover_label.full_text()
    # a click highlights the lineage: B dims, A keeps its colour
    with qtbot.waitSignal(view.lineage_selected, timeout=5_000) as selected:
        qtbot.mouseClick(view.graphics.viewport(), Qt.MouseButton.LeftButton, pos=point)
    assert selected.args[0] == h(1)
    assert pixel(qtbot, window, GPU0, slot_of(window, GPU0, 7)) == a_rgb
    assert pixel(qtbot, window, GPU0, b_slots[3]) != b_rgb
    view.select_lineage(None)

    # BlockRemoved frees the slots
    removed_slots = [slot_of(window, GPU0, n) for n in a[:5]]
    result(qtbot, pub.run(lambda p: p.publish([removed(a[:5])])))
    wait_blocks(qtbot, window, GPU0, 65)
    assert all(model.block_at(GPU0, s) is None and index_at(window, GPU0, s) == FREE_PAGE for s in removed_slots)
    assert "gaps 0 (0 unfilled) · replays 0" in window.kv_status.text()

    # a batch lost in transit: the next one shows the gap, the replay brings the lost blocks
    def gap(p):
        lost = p.publish([stored(chain(41, 5), 40, range(80))], lost=True)
        p.publish([stored([46], 45, range(16))])
        return lost
    lost_seq = result(qtbot, pub.run(gap))
    wait_blocks(qtbot, window, GPU0, 71)
    qtbot.waitUntil(lambda: "replays 1 (0 failed)" in window.kv_status.text(), timeout=WAIT_MS)
    assert "gaps 1 (0 unfilled)" in window.kv_status.text()
    assert result(qtbot, pub.run(lambda p: list(p.replay_requests))) == [0, lost_seq]  # history, then the gap
    for n in chain(41, 6):
        assert model.block_at(GPU0, slot_of(window, GPU0, n)).root == h(1)  # lineage A, A's colour
    assert {index_at(window, GPU0, slot_of(window, GPU0, n)) for n in chain(41, 6)} == \
        {index_at(window, GPU0, slot_of(window, GPU0, 20))}
    assert sorted(slot_of(window, GPU0, n) for n in chain(41, 5)) == sorted(removed_slots)  # freed slots reused
    assert f"expected seq {lost_seq}" in window.kv_status.toolTip()

    # a garbage frame is refused and counted, the stream goes on
    result(qtbot, pub.run(lambda p: p.send_garbage("not-msgpack")))
    qtbot.waitUntil(lambda: window.refresh() or "refused 1" in window.kv_status.text(), timeout=WAIT_MS)
    assert "payload is not msgpack" in window.kv_status.toolTip()

    # AllBlocksCleared empties the rank's map, which stays on screen
    result(qtbot, pub.run(lambda p: p.publish([cleared()])))
    wait_blocks(qtbot, window, GPU0, 0)
    assert view.pool_names == [GPU0]
    assert all(index_at(window, GPU0, s) == FREE_PAGE for s in range(model.pools[GPU0].num_slots))
    assert "events/s" in window.kv_status.text()


def test_two_endpoints_give_two_maps_and_a_shared_prefix_shares_its_colour(qtbot, window, publishers):
    first, second = publishers(), publishers()
    attach(qtbot, window, first, second)
    result(qtbot, first.run(lambda p: p.publish([stored(chain(1, 12), None, range(192))], rank=0)))
    result(qtbot, second.run(lambda p: [p.publish([stored(chain(1, 4), None, range(64))], rank=1),
                                        p.publish([stored(chain(500, 9), None, range(144))], rank=1)]))
    wait_blocks(qtbot, window, GPU0, 12)
    wait_blocks(qtbot, window, GPU1, 13)
    view = window.kv_view
    assert view.pool_names == [GPU0, GPU1]
    assert window.kv_map.pools[GPU0].endpoints == [first.endpoint]
    assert window.kv_map.pools[GPU1].endpoints == [second.endpoint]
    same = {index_at(window, GPU0, slot_of(window, GPU0, 2)), index_at(window, GPU1, slot_of(window, GPU1, 2))}
    other = index_at(window, GPU1, slot_of(window, GPU1, 503))
    assert len(same) == 1 and other not in same  # the prefix rooted at 1 is cached on both ranks
    assert window.kv_status.text().startswith("2 endpoints · ")
    assert first.endpoint in window.kv_status.toolTip() and second.endpoint in window.kv_status.toolTip()


# ---- what the mode shows and hides -------------------------------------------------------

def test_engine_only_controls_are_hidden_and_come_back_when_the_mode_ends(qtbot, window, publishers):
    docks = [d for d in window.findChildren(QDockWidget) if not d.isHidden()]
    assert docks and window.page_map.isVisible()
    attach(qtbot, window, publishers())
    window.refresh()
    engine_only = [window.demo_action, window.reconfigure_action, window.canary_action, window.ack_action,
                   *window.worker_actions.values()]
    for action in (*engine_only, window.export_action):
        assert not action.isVisible() and not action.isEnabled(), action.text()
    assert not window.engine_menu.menuAction().isVisible()
    assert not any(a.isVisible() for a in window.color_mode_actions)
    assert all(d.isHidden() for d in docks)
    assert not window.page_map.isVisible() and window.kv_view.isVisible()
    assert window.kv_status.isVisible() and not window.status_line.isVisible()
    assert [item.text for item in window.kv_view.graphics.ci.items] == [WAITING]  # no events yet, and it says so
    assert window.request("canary") is None and window.request("submit", prompt_ids=[1]) is None
    window.toggle_demo(True)  # the shortcut's slot: there is no engine to load
    assert window.demo is None and not window.demo_action.isChecked()
    assert "vLLM / SGLang" in window.windowTitle()
    assert window.kv_attach_action.isVisible() and window.kv_attach_action.isEnabled()
    assert window.attach_action.isVisible() and window.open_snapshot_action.isVisible()

    window.leave_kv_events()
    assert window.source.now.kind is Kind.NONE and window.source.kv_thread is None
    assert all(a.isVisible() for a in (*engine_only, window.export_action, *window.color_mode_actions))
    assert window.engine_menu.menuAction().isVisible()
    assert all(not d.isHidden() for d in docks) and window.page_map.isVisible() and not window.kv_view.isVisible()
    assert window.status_line.isVisible() and not window.kv_status.isVisible()
    assert window.windowTitle() == "PageWarden"


# ---- the command line and the dialog -------------------------------------------------------

def test_the_gui_flags_attach_at_start_and_the_dialog_switches_streams(qtbot, publishers, monkeypatch):
    first, second = publishers(), publishers(replay_endpoint=None)
    args = main.parse(["gui", "--attach-kv-events", first.endpoint, "--replay", first.replay_endpoint,
                       "--dialect", "vllm", "--theme", "dark"])
    shell = App(args)
    qtbot.addWidget(shell.window)
    shell.start()
    window = shell.window
    assert window.source.now.kind is Kind.KV_EVENTS
    assert window.source.kv_attach == KvAttach((first.endpoint,), (first.replay_endpoint,), "vllm")
    assert shell.hosted is None
    assert result(qtbot, first.run(lambda p: p.wait_for_subscriber(60)))
    result(qtbot, first.run(lambda p: p.publish([stored(chain(1, 3), None, range(48))])))
    wait_blocks(qtbot, window, GPU0, 3)

    class Accepting:  # File → Attach to vLLM / SGLang events…, filled in and accepted
        def __init__(self, parent):
            pass

        def exec(self):
            return 1

        def values(self):
            return check_kv_attach([second.endpoint], ["-"], "sglang")

    monkeypatch.setattr("gui.kv_event_view.KvAttachDialog", Accepting)
    window.kv_attach_action.trigger()
    assert window.source.kv_attach == KvAttach((second.endpoint,), (None,), "sglang")
    assert result(qtbot, second.run(lambda p: p.wait_for_subscriber(60)))
    result(qtbot, second.run(lambda p: p.publish([stored(chain(7, 2), None, range(32))], "sglang", rank=3)))
    wait_blocks(qtbot, window, "rank 3 · unspecified", 2)
    assert window.kv_view.pool_names == ["rank 3 · unspecified"]  # a new stream, a new map
    window.close()


@pytest.mark.parametrize("argv, message", [
    (["--replay", "tcp://127.0.0.1:5558"], "--replay and --dialect go with --attach-kv-events"),
    (["--dialect", "sglang"], "--replay and --dialect go with --attach-kv-events"),
    (["--attach", "tcp://127.0.0.1:5650", "--attach-kv-events", "tcp://127.0.0.1:5557"],
     "--attach (a PageWarden engine) and --attach-kv-events (vLLM / SGLang) exclude each other"),
    (["--attach-kv-events", "tcp://127.0.0.1:5557", "--demo-load"], "--demo-load needs a PageWarden engine"),
    (["--attach-kv-events", "tcp://*:5557"], "address 'tcp://*:5557': * is the engine's bind wildcard"),
    (["--attach-kv-events", "tcp://127.0.0.1:5557", "--replay", "tcp://127.0.0.1:1", "tcp://127.0.0.1:2"],
     "2 replay addresses for 1 endpoints"),
    (["--attach-kv-events", "tcp://127.0.0.1:5557", "tcp://127.0.0.1:5557"],
     "endpoint tcp://127.0.0.1:5557 is named twice"),
])
def test_bad_gui_flags_are_refused_naming_the_value(argv, message):
    with pytest.raises(ValueError) as raised:
        kv_attach_from_args(main.parse(["gui", *argv]))
    assert message in str(raised.value)


def test_a_bad_address_on_the_command_line_exits_2(qtbot, capsys):
    assert main.main(["gui", "--attach-kv-events", "tcp://127.0.0.1:70000"]) == 2
    assert "error: address 'tcp://127.0.0.1:70000': port '70000' is not in 1..65535" in capsys.readouterr().err


@pytest.fixture
def settings(tmp_path):
    return QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)


@pytest.mark.parametrize("endpoints, replay, message", [
    ("", "", "Event endpoints: no endpoint to watch"),
    ("127.0.0.1:5557", "", "Event endpoints: address '127.0.0.1:5557' has no scheme"),
    ("tcp://0.0.0.0:5557", "", "Event endpoints: address 'tcp://0.0.0.0:5557': 0.0.0.0 is the engine's bind wildcard"),
    ("tcp://gpu-box:5557 tcp://gpu-box:99999", "", "port '99999' is not in 1..65535"),
    ("tcp://gpu-box:5557", "udp://gpu-box:5558", "Replay endpoints: address 'udp://gpu-box:5558': scheme 'udp'"),
    ("tcp://gpu-box:5557", "tcp://gpu-box:5558 tcp://gpu-box:5559",
     "Replay endpoints: 2 replay addresses for 1 endpoints"),
])
def test_the_dialog_names_the_bad_value_and_refuses_to_attach(qtbot, settings, endpoints, replay, message):
    dialog = KvAttachDialog(settings=settings, endpoints=endpoints, replay=replay)
    qtbot.addWidget(dialog)
    assert message in dialog.problem()
    assert message in dialog.error.text() and not dialog.error.isHidden()
    assert not dialog.buttons.button(QDialogButtonBox.StandardButton.Ok).isEnabled()
    with pytest.raises(KvEventError):
        dialog.values()


def test_the_dialog_gives_what_to_watch_and_remembers_it(qtbot, settings):
    dialog = KvAttachDialog(settings=settings, endpoints="tcp://gpu-box:5557, tcp://gpu-box:5558",
                            replay="- tcp://gpu-box:5560")
    qtbot.addWidget(dialog)
    dialog.dialect.setCurrentText("sglang")
    assert dialog.problem() is None and dialog.error.isHidden()
    assert dialog.buttons.button(QDialogButtonBox.StandardButton.Ok).isEnabled()
    assert dialog.values() == KvAttach(("tcp://gpu-box:5557", "tcp://gpu-box:5558"), (None, "tcp://gpu-box:5560"),
                                       "sglang")
    dialog.accept()
    again = KvAttachDialog(settings=settings)
    qtbot.addWidget(again)
    assert again.values() == dialog.values()


def test_a_window_attach_that_cannot_be_made_changes_nothing(qtbot, window):
    with pytest.raises(KvEventError, match="scheme 'udp'"):
        window.attach_kv_events(KvAttach(("udp://127.0.0.1:5557",), (None,), "auto"))
    assert window.source.now.kind is Kind.NONE and window.page_map.isVisible()
