"""The window's one source: what it shows (a live engine, the vLLM agent, a snapshot, KV
events) and how it is linked, kept apart. The rules are pure functions of it (Qt-free part);
switching sources closes each one's threads once and drops a closed link's late signals."""

from __future__ import annotations

import socket

import pytest
from PySide6.QtCore import QObject, Signal

from engine.adapters.kv_attach import check_kv_attach
from engine.wire.protocol import Message
from gui.main_window import MainWindow
from gui.model.source import KV_TITLE, Kind, Link, Source
from gui.snapshot.bundle import write_bundle
from tests.gui.snapshot.test_snapshot_bundle import make_snapshot

LIVE = Source(Kind.LIVE, "tcp://127.0.0.1:5650", Link.CONNECTED)
AGENT = Source(Kind.VLLM_AGENT, "tcp://127.0.0.1:5650", Link.CONNECTED)
SNAPSHOT = Source(Kind.SNAPSHOT, "s.zip", Link.READ_ONLY, taken="2026-12-02", behind=LIVE)
KV = Source(Kind.KV_EVENTS, "tcp://127.0.0.1:5557", Link.READ_ONLY)


# ---- the rules, Qt-free ------------------------------------------------------------------

def test_the_link_is_kept_apart_from_the_kind():
    lost = LIVE.with_link(Link.LOST)
    assert lost.kind is Kind.LIVE and not lost.connected and lost.link_words() == "reconnecting"
    behind = SNAPSHOT.with_link(Link.LOST)  # the engine behind a snapshot: the snapshot stays what is shown
    assert behind.kind is Kind.SNAPSHOT and behind.behind.link is Link.LOST
    assert behind.link_words() == "read-only snapshot" and not behind.connected
    assert LIVE.with_engine_read_only(True) == AGENT and AGENT.with_engine_read_only(False) == LIVE
    assert SNAPSHOT.with_engine_read_only(True).behind.kind is Kind.VLLM_AGENT
    noted = Source().with_note("hosted engine starting")
    assert noted.link_words() == "hosted engine starting" and noted.with_link(Link.CONNECTING).note == ""


@pytest.mark.parametrize("source, viewer, control, controls, export, views_ro", [
    (Source(), False, False, False, False, False),
    (LIVE, True, True, True, True, False),
    (LIVE.with_link(Link.LOST), True, True, False, False, False),
    (AGENT, True, False, False, True, True),
    (SNAPSHOT, True, False, False, False, True),  # the engine behind it is only listened to
    (Source(Kind.SNAPSHOT, "s.zip", Link.READ_ONLY), False, False, False, False, True),
    (KV, False, False, False, False, False),
])
def test_what_the_window_allows_is_a_function_of_its_source(source, viewer, control, controls, export, views_ro):
    assert source.allows("keyframe", user_readonly=False) is viewer
    assert source.allows("canary", user_readonly=False) is control
    assert source.allows("canary", user_readonly=True) is False
    assert source.controls_enabled(False) is controls and source.controls_enabled(True) is False
    assert source.export_enabled(exporting=False) is export and source.export_enabled(exporting=True) is False
    assert source.views_read_only(False) is views_ro and source.views_read_only(True) is True


def test_the_title_says_the_source():
    assert Source().title(user_readonly=False) == "PageWarden"
    assert Source().title(user_readonly=True) == "PageWarden — read-only"
    assert LIVE.title(user_readonly=False, hostname="box", critical=2) == \
        "⚠ 2 critical firing — PageWarden — tcp://127.0.0.1:5650 on box"
    assert AGENT.title(user_readonly=False, engine_name="vLLM 0.32") == \
        "PageWarden — tcp://127.0.0.1:5650 — read-only engine: vLLM 0.32"
    assert SNAPSHOT.title(user_readonly=False, critical=3) == "PageWarden — snapshot s.zip (read-only)"
    assert KV.title(user_readonly=True) == KV_TITLE


# ---- the window ------------------------------------------------------------------------------

class CountingTransport(QObject):
    """What MainWindow.attach needs of a TransportThread; counts its starts and stops."""

    telemetry = Signal(list)
    status = Signal(dict)
    reply = Signal(int, str, object)
    stream_event = Signal(object)
    connection = Signal(str)

    def __init__(self, endpoint: str):
        super().__init__()
        self.endpoint, self.server_key, self.client_keys, self.telemetry_override = endpoint, None, None, None
        self.starts = self.stops = 0
        self.sent: list[tuple[str, dict]] = []

    def start(self) -> None:
        self.starts += 1

    def stop(self) -> None:
        self.stops += 1

    def request(self, op: str, **fields) -> int:
        self.sent.append((op, fields))
        return len(self.sent)


@pytest.fixture
def window(qtbot):
    w = MainWindow(theme="dark")
    qtbot.addWidget(w)
    yield w
    w.close()


def live(window: MainWindow, endpoint: str) -> CountingTransport:
    transport = CountingTransport(endpoint)
    window.attach(transport, endpoint, hosted=True)
    transport.connection.emit("connected")
    return transport


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_switching_sources_closes_each_once_and_a_snapshot_keeps_the_engine_behind_it(window, tmp_path):
    first = live(window, "tcp://127.0.0.1:5555")
    assert first.starts == 1 and window.source.now.connected
    assert window.status_line.connection_label.text() == "connected"

    bundle = write_bundle(make_snapshot(), tmp_path / "s.zip")
    assert window.open_snapshot(str(bundle))
    assert window.source.now.kind is Kind.SNAPSHOT and window.source.now.behind.label == "tcp://127.0.0.1:5555"
    assert first.stops == 0 and window.status_line.connection_label.text() == "read-only snapshot"
    first.connection.emit("reconnecting")  # the engine behind it: noted, not shown
    assert window.source.now.behind.link is Link.LOST and window.status_line.connection_label.text() == \
        "read-only snapshot"
    window.close_snapshot()
    assert window.source.now.kind is Kind.LIVE and window.source.transport is first and first.stops == 0
    assert window.status_line.connection_label.text() == "reconnecting"

    second = live(window, "tcp://127.0.0.1:6666")
    assert first.stops == 1 and second.starts == 1
    window.attach_kv_events(check_kv_attach([f"tcp://127.0.0.1:{unused_port()}"]))
    thread = window.source.kv_thread
    assert second.stops == 1 and window.source.transport is None and thread.isRunning()
    assert window.windowTitle() == KV_TITLE and window.status_line.isHidden()

    third = live(window, "tcp://127.0.0.1:7777")
    assert thread.isFinished() and window.source.kv_thread is None and not window.status_line.isHidden()
    window.close()
    window.close()
    assert (first.stops, second.stops, third.stops) == (1, 1, 1)
    assert window.source.now == Source()


def test_a_closed_links_late_signals_reach_nobody(window):
    first = live(window, "tcp://127.0.0.1:5555")
    answers = []
    ticket = window.request("ack_alert", lambda result, error: answers.append(result), ids=["a"])
    second = live(window, "tcp://127.0.0.1:6666")
    first.reply.emit(ticket, "ack_alert", {"acked": 1})  # the old engine's late answer
    first.telemetry.emit([Message({"topic": "metrics", "tokens_per_s": 99.0})])
    first.connection.emit("reconnecting")
    assert answers == [] and not window.state.metrics["tokens_per_s"] and window.source.now.connected
    second.telemetry.emit([Message({"topic": "metrics", "tokens_per_s": 5.0})])
    assert window.state.metrics["tokens_per_s"][-1][1] == 5.0


def test_each_answer_goes_to_the_callback_its_request_named(window):
    transport = live(window, "tcp://127.0.0.1:5555")
    answers = []
    one = window.request("scope", lambda result, error: answers.append(("one", result, error)), since=0, until=1)
    two = window.request("scope", lambda result, error: answers.append(("two", result, error)), since=1, until=2)
    transport.reply.emit(two, "scope", {"pairs": [2]})
    transport.reply.emit(one, "scope", {"error": {"code": "bad", "message": "no"}})
    assert answers == [("two", {"pairs": [2]}, None), ("one", {"error": {"code": "bad", "message": "no"}},
                                                        {"code": "bad", "message": "no"})]
    assert not window.source.answers
    three = window.request("canary")  # nobody asked for its answer: an error shows in the message area
    transport.reply.emit(three, "canary", {"error": {"code": "refused", "message": "not now"}})
    assert window.message_area.message() == "canary failed: not now"


def test_a_hosted_engine_says_it_is_starting_until_it_is_attached(window):
    window.source.set_note("hosted engine starting")
    assert window.status_line.connection_label.text() == "hosted engine starting"
    assert window.windowTitle() == "PageWarden"
    live(window, "tcp://127.0.0.1:5555")
    assert window.status_line.connection_label.text() == "connected"
    assert window.status_line.address_label.text() == "hosted engine tcp://127.0.0.1:5555"
