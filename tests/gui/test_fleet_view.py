"""The Fleet view: its rows' order (Qt-free), then the view over a fake Prometheus (http.server in
a thread, tests/engine/adapters/test_prometheus_fleet.py): rows arrive off the GUI thread, Enter
attaches the window to the row's control endpoint through the app's attach path, Back returns,
and a Prometheus that stops answering shows its error while the window keeps answering.

No sleeps: every wait is qtbot.waitUntil on a condition."""

from __future__ import annotations

import argparse
import threading

import pytest
from PySide6.QtCore import QSettings, Qt, QTimer
from PySide6.QtTest import QTest

import gui.app
import main
from engine.adapters.prometheus_fleet import EngineRow, FleetSnapshot
from gui.app import App
from gui.fleet_view import FleetView
from gui.model.fleet import FleetModel, fleet_rows
from gui.model.source import Kind
from tests.engine.adapters.test_prometheus_fleet import FakePrometheus
from tests.gui.test_window_source import CountingTransport

pytestmark = pytest.mark.gui
WAIT_MS = 60_000

HEALTHY = EngineRow("a:1", up=True, control="tcp://10.0.0.1:5650", pools={"decode": 0.3})
FAULTY = EngineRow("z:1", up=True, control="tcp://10.0.0.9:5650", crossed_events_5m=2, cross_reads_5m=40)
DOWN = EngineRow("m:1", up=False, control="tcp://10.0.0.5:5650")


# ---- the model, Qt-free -------------------------------------------------------------------

def test_the_worst_engines_come_first():
    rows = fleet_rows(FleetSnapshot("http://p", (HEALTHY, DOWN, FAULTY, EngineRow("b:1", up=True))))
    assert [r.engine.instance for r in rows] == ["z:1", "m:1", "a:1", "b:1"]  # ties by name
    assert rows[0].finding.startswith("data crossed") and rows[1].finding.startswith("down")
    assert rows[2].finding == "healthy"
    ranked = [EngineRow("r", restarts_15m=1), EngineRow("w", capacity_exceeds=True), EngineRow("d", up=False),
              EngineRow("i", critical_firing=1), EngineRow("x", cross_reads_5m=1), EngineRow("h")]
    assert [r.engine.instance for r in fleet_rows(FleetSnapshot("p", tuple(ranked)))] == ["x", "i", "d", "w", "r", "h"]


def test_a_failed_refresh_keeps_the_rows_and_says_their_age():
    model = FleetModel("http://p")
    assert model.update(FleetSnapshot("http://p", (HEALTHY,), taken=1000.0, took_s=0.02))
    assert "1 engine" in model.status_text(1001.0) and "20 ms" in model.status_text(1001.0)
    assert not model.update(FleetSnapshot("http://p", taken=1090.0, error="cannot reach Prometheus at http://p"))
    assert [r.engine for r in model.rows] == [HEALTHY] and model.failing
    assert model.status_text(1090.0) == "cannot reach Prometheus at http://p · showing rows 90 s old"
    model.update(FleetSnapshot("http://p", taken=1100.0, error="/api/v1/query answered HTTP 500: boom"))
    assert model.status_text(1100.0).startswith("Prometheus http://p: /api/v1/query answered HTTP 500")


# ---- the view ------------------------------------------------------------------------------

@pytest.fixture
def prometheus():
    prom = FakePrometheus(hold=threading.Event())  # answers only once released
    yield prom
    prom.stop()


@pytest.fixture
def app(qtbot, monkeypatch):
    monkeypatch.setattr(gui.app, "TransportThread", lambda endpoint, **keys: CountingTransport(endpoint))
    settings = QSettings()
    for key in ("fleet/server_key", "fleet/client_keys"):
        settings.remove(key)
    shell = App(argparse.Namespace(readonly=False, theme="dark"))
    qtbot.addWidget(shell.window)
    yield shell
    shell.window.close()


def open_fleet(app: App, url: str) -> FleetView:
    view = app.window.fleet.open(url, refresh_s=3600, timeout_s=30)
    return view


def test_rows_arrive_off_the_gui_thread_and_enter_attaches_to_the_rows_engine(app, prometheus, qtbot):
    view = open_fleet(app, prometheus.url)
    assert view.inflight and view.table_model.rows == []  # the query waits; the window does not
    ticks = []
    QTimer.singleShot(0, lambda: ticks.append(1))
    qtbot.waitUntil(lambda: bool(ticks), timeout=WAIT_MS)
    prometheus.hold.set()
    qtbot.waitUntil(lambda: len(view.table_model.rows) == 3, timeout=WAIT_MS)
    assert [r.engine.instance for r in view.table_model.rows] == ["b:9100", "c:9100", "a:9100"]
    assert "3 engines" in view.status.text() and prometheus.url in view.status.text()

    view.table.setFocus()
    view.table.setCurrentIndex(view.table_model.index(1, 0))  # c: down, a vLLM agent
    QTest.keyClick(view.table, Qt.Key.Key_Return)
    source = app.window.source
    assert source.now.kind is Kind.LIVE and source.now.label == "tcp://10.0.0.3:5650"
    assert source.transport.endpoint == "tcp://10.0.0.3:5650" and source.transport.starts == 1

    view.close()
    assert not view.isVisible() and app.window.back_action.isEnabled()
    assert app.window.back_action.shortcut().toString() == "Alt+Left"
    app.window.back_action.trigger()
    assert view.isVisible()
    assert source.now.label == "tcp://10.0.0.3:5650"  # Back shows the fleet; the engine stays the source

    view.setFocus()
    view.table.setCurrentIndex(view.table_model.index(0, 0))
    QTest.keyClick(view.table, Qt.Key.Key_Enter)
    assert source.now.label == "tcp://10.0.0.2:5650" and source.transport.starts == 1


def test_a_prometheus_that_stops_answering_shows_its_error_and_the_window_answers(app, prometheus, qtbot):
    prometheus.hold.set()
    view = open_fleet(app, prometheus.url)
    view.query.timeout_s = 2.0
    qtbot.waitUntil(lambda: len(view.table_model.rows) == 3, timeout=WAIT_MS)
    prometheus.hold = threading.Event()  # from now on it accepts and never answers
    view.refresh()
    assert view.inflight
    ticks = []
    timer = QTimer(view)
    timer.timeout.connect(lambda: ticks.append(1))
    timer.start(10)
    qtbot.waitUntil(lambda: len(ticks) >= 3, timeout=WAIT_MS)  # events flow while the query hangs
    view.refresh()  # one in flight at most: a second ask waits for it
    qtbot.waitUntil(lambda: not view.inflight, timeout=WAIT_MS)
    timer.stop()
    assert "did not answer within 2 s" in view.status.text() and "old" in view.status.text()
    assert len(view.table_model.rows) == 3  # the last good rows stay
    prometheus.hold.set()


def test_a_dead_prometheus_is_said_at_once(app, qtbot):
    view = open_fleet(app, "http://127.0.0.1:9")  # discard: nothing listens
    qtbot.waitUntil(lambda: not view.inflight, timeout=WAIT_MS)
    assert "cannot reach Prometheus" in view.status.text() and "no rows yet" in view.status.text()


def test_the_fleet_option_opens_the_view_without_hosting_an_engine(qtbot):
    args = main.parse(["gui", "--fleet", "http://127.0.0.1:9", "--fleet-refresh", "60"])
    shell = App(args)
    qtbot.addWidget(shell.window)
    try:
        shell.start()
        qtbot.waitUntil(lambda: shell.window.fleet.view is not None, timeout=WAIT_MS)
        assert shell.hosted is None and shell.window.fleet.view.refresh_s == 60
        assert shell.window.source.now.kind is Kind.NONE
    finally:
        shell.window.close()
    wrong = App(main.parse(["gui", "--fleet-refresh", "5", "--attach", "tcp://127.0.0.1:1"]))
    qtbot.addWidget(wrong.window)
    with pytest.raises(ValueError, match="--fleet-refresh goes with --fleet"):
        wrong.start()
    wrong.window.close()


def test_a_row_attaches_with_the_keys_the_fleet_dialog_remembered(qtbot, tmp_path):
    from gui.dialogs.fleet_dialog import FleetDialog

    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    (tmp_path / "server.key").write_text("k")
    (tmp_path / "client.key_secret").write_text("s")
    dialog = FleetDialog(settings=settings)
    qtbot.addWidget(dialog)
    dialog.url.setText("prometheus:9090")
    assert "http://host:9090" in dialog.problem()
    dialog.url.setText("http://prometheus:9090")
    dialog.server_key.setText(str(tmp_path / "server.key"))
    dialog.client_keys.setText(str(tmp_path / "nowhere"))
    assert "Client key not found" in dialog.problem()
    dialog.client_keys.setText(str(tmp_path / "client.key_secret"))
    assert dialog.problem() is None
    dialog.accept()
    assert dialog.values() == {"url": "http://prometheus:9090", "job_regex": ".*", "refresh_s": None}

    view = FleetView("http://127.0.0.1:9", settings=settings)
    qtbot.addWidget(view)
    asked = []
    view.attach_requested.connect(asked.append)
    view.attach_row(fleet_rows(FleetSnapshot("p", (HEALTHY,)))[0])
    assert asked == [{"endpoint": "tcp://10.0.0.1:5650", "server_key": str(tmp_path / "server.key"),
                      "client_keys": str(tmp_path / "client.key_secret")}]
    view.attach_row(fleet_rows(FleetSnapshot("p", (EngineRow("never-seen:1", up=False),)))[0])
    assert len(asked) == 1 and "no control endpoint known" in view.status.text()
    view.stop()


def test_counts_from_increase_are_shown_whole_and_models_by_their_name():
    """Prometheus's increase() extrapolates (323.395 for 323 events, seen on a live fleet); the
    row says a whole number, and "about" when it was not one; a model is its directory's name."""
    from gui.model.fleet import count_words, model_words

    assert count_words(323.395) == "about 323" and count_words(28583.9) == "about 28,584"
    assert count_words(3.0) == "3" and count_words(0.0) == "0"
    assert model_words("/work/main/resources/models/pagewarden-copy") == "pagewarden-copy"
    assert model_words("") == "–"
