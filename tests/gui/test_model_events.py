"""Issue 13, the window: views follow the Qt-free model's events, and one selection is seen
by every view. Nothing here edits or reaches into MainWindow.refresh."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QItemSelectionModel
from PySide6.QtWidgets import QLabel

from engine.wire.protocol import Message, pack, unpack
from gui.main_window import MainWindow
from gui.model.engine_state import EngineState
from gui.model.events import Events, Subscriptions
from gui.model.selection import Selection
from gui.widgets.state_view import StateView
from tests.gui.test_page_map import LAYOUT, REQUESTS, keyframe

# ---- the Qt-free mechanism ------------------------------------------------------------------

def test_marks_are_delivered_once_per_flush_to_each_callback():
    events, calls = Events("pages", "requests", "alerts"), []

    def paint():
        calls.append("paint")

    events.pages.connect(paint)
    events.requests.connect(paint)  # one view following two kinds of change
    events.alerts.connect(lambda: calls.append("alerts"))
    events.pages.mark()
    events.requests.mark()
    events.pages.mark()
    assert calls == []  # nothing before the frame
    events.flush()
    assert calls == ["paint"]
    events.flush()
    assert calls == ["paint"]  # marks are forgotten once delivered
    events.alerts.emit()
    assert calls == ["paint", "alerts"]  # emit: at once


def test_an_undeclared_event_is_refused():
    events = Events("pages")
    with pytest.raises(AttributeError, match="no event 'page'"):
        events.page.connect(print)
    with pytest.raises(KeyError):
        events.mark("page")


def test_a_failing_callback_does_not_starve_the_others():
    events, calls = Events("pages"), []

    def broken():
        raise RuntimeError("boom")

    events.pages.connect(broken)
    events.pages.connect(lambda: calls.append(1))
    events.pages.mark()
    with pytest.raises(RuntimeError, match="boom"):
        events.flush()
    assert calls == [1]


def test_subscriptions_move_from_one_model_to_the_next():
    old, new, calls = Events("metrics"), Events("metrics"), []
    subs = Subscriptions(metrics=lambda: calls.append("m"))
    subs.follow(old)
    subs.follow(new)
    old.metrics.emit()
    assert calls == []
    new.metrics.emit()
    assert calls == ["m"]


def test_engine_state_marks_what_a_message_changed():
    state = EngineState()
    state.apply(Message({"topic": "metrics", "tokens_per_s": 5.0}), now=1.0)
    state.apply(Message({"topic": "no-such-topic"}), now=1.0)
    state.apply_status({"workers": []})
    # every topic, known or not, also marks its own event and `topics` (the Telemetry inspector's)
    assert set(state.events.pending) == {"metrics", "workers", "capacity", "engine", "topics", "topic:metrics",
                                         "topic:no-such-topic"}
    assert state.check_stale(now=100.0) and state.events.pending[-1] == "stale"


# ---- a new view, added without touching the window ----------------------------------------

class TokensView(StateView, QLabel):
    """What a new telemetry view looks like: it names what it follows, nothing else."""

    def __init__(self, state: EngineState, parent=None):
        super().__init__(parent)
        self.refreshes = 0
        self.state = state

    def follows(self) -> dict:
        return {"metrics": self.refresh}

    def refresh(self) -> None:
        self.refreshes += 1
        series = self.state.metrics["tokens_per_s"]
        self.setText(f"{series[-1][1]:.0f} tokens/s" if series else "—")


@pytest.fixture
def window(qtbot):
    w = MainWindow(theme="dark")
    qtbot.addWidget(w)
    yield w
    w.close()


def metrics(value: float) -> Message:
    return unpack(pack({"topic": "metrics", "seq": 1, "tokens_per_s": value}))


def test_a_new_view_following_an_event_is_refreshed_by_the_window_once_per_frame(window):
    view = TokensView(window.state, parent=window)
    window.refresh()
    assert view.refreshes == 0  # no metrics yet
    window.on_telemetry([metrics(10.0), metrics(12.0)])  # two messages in one frame
    window.on_telemetry([Message({"topic": "workers", "workers": []})])  # a change it does not follow
    window.refresh()
    assert view.refreshes == 1 and view.text() == "12 tokens/s"
    window.refresh()
    assert view.refreshes == 1
    # a new engine (or a snapshot): the window hands every view the new state, this one too
    old = window.state
    window.state = window._fresh_state()
    assert view.state is window.state is not old
    old.apply(metrics(99.0))
    window.on_telemetry([metrics(7.0)])
    window.refresh()
    assert view.text() == "7 tokens/s"
    assert old.events.metrics.callbacks == []  # nothing follows the old state any more


# ---- one selection --------------------------------------------------------------------------

def feed(window: MainWindow) -> None:
    messages = [unpack(keyframe(name, role, n, runs)) for name, role, n, runs in LAYOUT]
    messages += [unpack(pack({"topic": "requests", "seq": slot, "request_id": rid, "slot": slot, "tenant": tenant,
                              "phase": "decoding", "prompt_len": 100, "pages": {"prefill-0": 3}}))
                 for slot, (rid, tenant) in REQUESTS.items()]
    window.on_telemetry(messages)
    window.refresh()


def test_one_selection_is_seen_by_every_view(window):
    feed(window)
    state, table, page_map = window.state, window.requests_table, window.page_map
    assert page_map.colors.selection is state.selection  # the colours read the same owner
    # the requests table selects: the state and the page map see it at once
    row = table.model.row_of("req-b")
    table.view.selectionModel().setCurrentIndex(table.model.index(row, 0),
                                                QItemSelectionModel.ClearAndSelect | QItemSelectionModel.Rows)
    assert state.selection.request_id == "req-b" and state.selection.slot == 2
    assert page_map.selected_slot == 2 and page_map.colors.selected_slot == 2
    # the page map selects (a click on a page of slot 1): the table follows
    page_map._select_slot(1)
    assert state.selected_request == "req-a" and table.selected_request() == "req-a"
    # an alert's request link (the window): everyone follows
    window.select_request("req-d")
    assert (table.selected_request(), page_map.selected_slot, state.selection.slot) == ("req-d", 4, 4)
    # a selection written to the model alone
    state.selection.select("req-c", 3)
    assert table.selected_request() == "req-c" and page_map.selected_slot == 3
    # a click on a free page clears it everywhere
    page_map._select_slot(None)
    assert state.selection.request_id is None and table.selected_request() is None
    assert page_map.selected_slot is None


def test_a_new_engine_starts_with_nothing_selected_and_the_views_follow_its_selection(window):
    feed(window)
    window.select_request("req-a")
    window.state = window._fresh_state()
    assert window.page_map.selected_slot is None
    assert window.page_map.colors.selection is window.state.selection
    feed(window)
    window.state.select_request("req-c")
    assert window.requests_table.selected_request() == "req-c" and window.page_map.selected_slot == 3


def test_selection_emits_only_on_change():
    calls = []
    selection = Selection()
    selection.changed.connect(lambda: calls.append(1))
    assert selection.select("r", 1) and not selection.select("r", 1)
    assert selection.clear() and calls == [1, 1]
