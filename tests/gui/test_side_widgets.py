"""The side widgets over an EngineState built from real protocol messages (pack -> unpack)."""

from __future__ import annotations

import itertools
import json
import time

import pytest
from PySide6.QtCore import QItemSelectionModel, Qt
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QApplication, QMessageBox, QWidget

from engine.capacity import check_capacity
from engine.config import EngineConfig
from engine.wire.protocol import pack, unpack
from gui import theme
from gui.model.engine_state import EngineState, WorkerRow
from gui.widgets.alerts_table import AlertsTable, page_ranges
from gui.widgets.capacity_banner import CapacityBanner
from gui.widgets.metrics_plots import MetricsPlots
from gui.widgets.requests_table import COLUMNS as REQUEST_COLUMNS
from gui.widgets.requests_table import RequestsTable
from gui.widgets.status_line import STALE_OPACITY, StatusLine
from gui.widgets.toast import Toast
from gui.widgets.workers_panel import USAGE_COLUMN, WorkersPanel, actions_enabled

_seq = itertools.count(1)
WORKER_STATES = ("starting", "ready", "draining", "stopping", "stopped", "crashed")


def send(target: EngineState, topic: str, /, at: float | None = None, **fields) -> set[str]:
    """Fold one telemetry message into `target` the way the transport delivers it (at monotonic `at`)."""
    frames = pack({"topic": topic, "seq": next(_seq), "time": time.time(), **fields})
    return target.apply(unpack([bytes(f) for f in frames]), at)


def findings(window: int, prefill_pages: int, decode_pages: int = 131_072) -> list[dict]:
    config = EngineConfig().replace(engine={"context_window": window},
                                    pools={"prefill": {"pages": prefill_pages}, "decode": {"pages": decode_pages}})
    return [f.to_dict() for f in check_capacity(config)]


def worker(name: str, state: str, role: str = "decode", inflight: int = 0, used: int = 10) -> dict:
    return {"name": name, "role": role, "state": state, "pid": 1000 + len(name), "device": "cpu",
            "pool": {"name": name, "pages": 256, "used_pages": used}, "inflight": inflight}


def request(rid: str, slot: int, phase: str = "decoding", **extra) -> dict:
    return {"request_id": rid, "slot": slot, "tenant": f"t{slot % 3}", "prompt_len": 100 + slot, "phase": phase,
            "pages": {"prefill-0": 2, "decode-0": 3}, "ttft_s": 0.0125, "tokens": slot, **extra}


# ---- capacity banner -------------------------------------------------------------------

def test_banner_shows_both_numbers_and_hides_only_when_findings_clear(qtbot):
    state = EngineState()
    banner = CapacityBanner(state)
    qtbot.addWidget(banner)
    assert banner.isHidden()
    send(state, "capacity", findings=findings(1_048_576, 42_580), exceeds=True)  # the incident's numbers
    banner.refresh()
    assert not banner.isHidden()
    assert banner.shown_lines() == [
        "Context window 1,048,576 tokens exceeds the prefill pool (681,280 tokens) by 367,296 tokens — "
        "requests longer than 681,280 tokens cannot be served"]
    assert "681,280" in " ".join(banner.shown_lines()) and "1,048,576" in " ".join(banner.shown_lines())
    banner.refresh()  # nothing but a later capacity message may hide it
    assert not banner.isHidden()
    send(state, "capacity", findings=findings(600_000, 42_580), exceeds=False)
    banner.refresh()
    assert banner.isHidden()


def test_banner_reconfigure_emits_and_readonly_disables(qtbot):
    state = EngineState()
    send(state, "capacity", findings=findings(1_048_576, 42_580, 1_000), exceeds=True)
    banner = CapacityBanner(state)
    qtbot.addWidget(banner)
    assert len(banner.shown_lines()) == 2  # both pools are short: one line each
    with qtbot.waitSignal(banner.reconfigure_requested, timeout=1000):
        banner.reconfigure_button.click()
    banner.set_readonly(True)
    assert not banner.reconfigure_button.isEnabled()


# ---- alerts ----------------------------------------------------------------------------

def alert_state(n: int = 3) -> EngineState:
    state = EngineState()
    base = time.time() - n - 10
    for i in range(n):
        send(state, "alerts", id=f"a{i}", kind="ownership_violation" if i % 2 else "late_write_dropped",
             severity="critical" if i % 2 else "warning", state=("firing", "pending", "resolved")[i % 3],
             detail=f"request r{i} read page {i}", requests=[f"r{i}"], pages=[i, i + 1, i + 2],
             acked=False, time=base + i)
    return state


def test_alerts_table_newest_first_with_state(qtbot):
    state = alert_state(3)
    table = AlertsTable(state)
    qtbot.addWidget(table)
    model = table.model
    assert model.rowCount() == 3
    assert [model.index(r, 2).data() for r in range(3)] == ["late_write_dropped", "ownership_violation",
                                                           "late_write_dropped"]
    assert [r.id for r in model.rows] == ["a2", "a1", "a0"]
    assert [model.index(r, 6).data() for r in range(3)] == ["resolved", "pending", "firing"]
    assert model.index(0, 4).data() == "2–4"
    table.filter.setCurrentIndex(1)  # unresolved only
    assert [r.id for r in model.rows] == ["a1", "a0"]


def test_acknowledge_emits_selected_ids_and_readonly_disables(qtbot):
    state = alert_state(3)
    table = AlertsTable(state)
    qtbot.addWidget(table)
    assert not table.acknowledge_button.isEnabled()  # nothing selected
    table.view.selectAll()
    assert table.acknowledge_button.isEnabled()
    with qtbot.waitSignal(table.acknowledge_requested, timeout=1000) as blocker:
        table.acknowledge_button.click()
    assert sorted(blocker.args[0]) == ["a0", "a1", "a2"]
    table.set_readonly(True)
    assert not table.acknowledge_button.isEnabled() and not table.acknowledge_action.isEnabled()
    table.set_readonly(False)
    for i in range(3):  # the engine reports them acknowledged: nothing left to acknowledge
        send(state, "alerts", id=f"a{i}", kind="k", severity="info", state="firing", acked=True)
    table.refresh()
    assert table.model.index(0, 7).data() == "yes"
    assert not table.acknowledge_button.isEnabled()


def test_alert_context_menu_exports_snapshot_of_the_row(qtbot):
    table = AlertsTable(alert_state(3))
    qtbot.addWidget(table)
    table.view.selectRow(1)
    menu = table.context_menu()
    assert [a.text() for a in menu.actions() if a.text()] == ["Acknowledge", "Export incident snapshot…", "Copy",
                                                              "Copy as JSON"]
    with qtbot.waitSignal(table.snapshot_requested, timeout=1000) as blocker:
        table.snapshot_action.trigger()
    assert blocker.args == ["a1"]


def test_ctrl_c_copies_whole_alerts_and_json_keeps_every_field(qtbot):
    # issue 15, item 10: Ctrl+C copied one cell; alerts go into tickets whole
    from PySide6.QtGui import QGuiApplication

    table = AlertsTable(alert_state(3))
    qtbot.addWidget(table)
    table.show()
    table.view.selectRow(0)
    table.view.selectionModel().select(table.model.index(2, 0), QItemSelectionModel.Select | QItemSelectionModel.Rows)
    table.view.setFocus()
    qtbot.keyClick(table.view, Qt.Key_C, Qt.ControlModifier)
    text = QGuiApplication.clipboard().text()
    blocks = text.split("\n\n")
    assert len(blocks) == 2 and blocks[0].startswith("late_write_dropped · warning · resolved")
    assert "requests: r2" in blocks[0] and "pages: 2–4" in blocks[0] and "request r2 read page 2" in blocks[0]
    assert "request r0 read page 0" in blocks[1]
    copied = json.loads(table.copy_selected("json"))
    assert [a["id"] for a in copied] == ["a2", "a0"] and copied[0]["pages"] == [2, 3, 4]
    assert json.loads(QGuiApplication.clipboard().text()) == copied


def test_alerts_refresh_keeps_selection_and_scales_to_2000_rows(qtbot):
    state = alert_state(2000)
    table = AlertsTable(state)
    qtbot.addWidget(table)
    resets = []
    table.model.modelReset.connect(lambda: resets.append(1))
    table.view.selectRow(5)
    chosen = table.selected_ids()
    start = time.perf_counter()
    for _ in range(10):
        table.refresh()
    assert time.perf_counter() - start < 1.0
    assert resets == []  # nothing changed: no reset
    send(state, "alerts", id="new", kind="k", severity="critical", state="firing", time=time.time())
    table.refresh()
    assert resets == [1] and table.model.rows[0].id == "new"
    assert table.selected_ids() == chosen


def test_page_ranges():
    assert page_ranges([9, 3, 4, 5]) == "3–5, 9"
    assert page_ranges(list(range(0, 20, 2))) == "0, 2, 4, 6 +6"


# ---- toast -------------------------------------------------------------------------------

def test_toast_shows_stacks_and_hides(qtbot):
    host = QWidget()
    host.resize(800, 500)
    qtbot.addWidget(host)
    host.show()
    state = alert_state(2)
    toast = Toast(host, duration_ms=300)
    new = state.take_new_alerts()
    assert [a.id for a in new] == ["a0"]  # only firing alerts are new
    first = toast.show_alert(new[0])
    second = toast.show_alert(state.alerts["a1"])
    assert toast.cards() == [first, second]
    assert first.y() + first.height() <= second.y()  # stacked, newest at the bottom
    assert second.geometry().right() < host.width() and second.geometry().bottom() < host.height()
    assert "ownership_violation" in second.title.text()
    qtbot.waitUntil(lambda: toast.cards() == [], timeout=3000)


def test_a_flood_of_one_alert_kind_is_one_card_saying_how_many(qtbot):
    host = QWidget()
    host.resize(800, 600)
    qtbot.addWidget(host)
    host.show()
    state = EngineState()
    now = time.time()
    for i in range(40):  # one transfer_mismatch per faulted request, as a faulted vLLM load raises them
        send(state, "alerts", id=f"t{i}", kind="transfer_mismatch", severity="critical", state="firing",
             detail=f"request r{i}: 2 of 3 loaded block(s) failed", requests=[f"r{i}"], pages=[i],
             acked=False, time=now + i / 100)
    send(state, "alerts", id="c0", kind="canary_leak", severity="critical", state="firing", detail="canary read",
         requests=["r99"], pages=[1], acked=False, time=now + 1)
    toast = Toast(host, duration_ms=60_000, state=state)
    toast.show_new_alerts()
    cards = toast.cards()
    assert len(cards) == 2
    flood = next(c for c in cards if "transfer_mismatch" in c.title.text())
    assert flood.alert_id == "t39" and "40 new transfer_mismatch alerts" in flood.body.text()
    assert "request r39" in flood.body.text()


def test_toast_overflow_never_strands_a_card_and_text_is_whole(qtbot):
    """Seen in a screenshot: the card that pushed the stack past max_cards was dropped from
    the stack before it was shown, then shown at the window's top-left, over the menu bar,
    for good; a long detail was cut at the card's bottom."""
    from PySide6.QtWidgets import QLabel, QMainWindow

    from gui.model.engine_state import AlertRow
    from gui.widgets.toast import WIDTH, ToastCard

    host = QMainWindow()
    host.setCentralWidget(QLabel("maps"))
    host.menuBar().addMenu("File")
    host.resize(1000, 420)
    qtbot.addWidget(host)
    host.show()
    qtbot.waitExposed(host)
    toast = Toast(host, duration_ms=60_000, max_cards=5)
    for i in range(7):
        detail = "request r44 touched pages written by canary canary-22 (the data WAS read) " * (1 + i % 3)
        toast.show_alert(AlertRow(f"a{i}", "canary_leak", "critical", "firing", False, 1.0, 1.0, 1,
                                  [f"r{i}", "canary-22"], [], detail))
    shown = [c for c in host.findChildren(ToastCard) if c.isVisible()]
    assert shown == toast.cards() and shown[-1].alert_id == "a6"  # every visible card is managed
    top = host.centralWidget().geometry().top()
    for card in shown:
        assert card.x() == host.width() - WIDTH - 12 and card.y() >= top, card.geometry()
        assert card.body.height() >= card.body.heightForWidth(card.body.width())  # the text whole
    for a, b in zip(shown, shown[1:]):
        assert a.geometry().bottom() < b.y()  # stacked, no overlap


# ---- workers -----------------------------------------------------------------------------

@pytest.mark.parametrize("state", WORKER_STATES)
def test_actions_enabled_is_a_function_of_state(state):
    row = WorkerRow.from_wire(worker("decode-0", state))
    got = actions_enabled(row, readonly=False)
    assert got == {"start": state in ("stopped", "crashed"), "stop": state in ("ready", "starting", "draining"),
                   "restart": state in ("ready", "starting", "draining"), "reconfigure": True}
    assert not any(actions_enabled(row, readonly=True).values())
    assert not any(actions_enabled(row, readonly=False, connected=False).values())


def test_actions_without_a_selected_worker():
    assert actions_enabled(None, readonly=False) == {"start": False, "stop": False, "restart": False,
                                                      "reconfigure": True}


def test_workers_panel_buttons_follow_selection_state_and_readonly(qtbot):
    state = EngineState()
    send(state, "workers", workers=[worker("prefill-0", "ready", "prefill"), worker("decode-0", "crashed")])
    panel = WorkersPanel(state)
    qtbot.addWidget(panel)
    enabled = lambda: {op: b.isEnabled() for op, b in panel.buttons.items()}  # noqa: E731
    assert enabled() == {"start": False, "stop": False, "restart": False, "reconfigure": True}
    panel.select_worker("decode-0")
    assert enabled() == {"start": True, "stop": False, "restart": False, "reconfigure": True}
    send(state, "workers", workers=[worker("prefill-0", "ready", "prefill"), worker("decode-0", "starting")])
    panel.refresh()
    assert panel.selected_worker().state == "starting"
    assert enabled() == {"start": False, "stop": True, "restart": True, "reconfigure": True}
    assert panel.model.index(1, USAGE_COLUMN).data() == "10/256"
    panel.set_readonly(True)
    assert not any(enabled().values())


def test_stop_asks_first_and_names_the_worker(qtbot, monkeypatch):
    state = EngineState()
    send(state, "workers", workers=[worker("decode-0", "ready", inflight=3)])
    panel = WorkersPanel(state)
    qtbot.addWidget(panel)
    panel.select_worker("decode-0")
    asked, emitted = [], []
    panel.command_requested.connect(lambda op, name: emitted.append((op, name)))
    answer = [QMessageBox.No]
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: asked.append(a[2]) or answer[0])
    panel.buttons["stop"].click()
    assert emitted == [] and len(asked) == 1
    assert "decode-0" in asked[0] and "3 in-flight requests will fail" in asked[0]
    answer[0] = QMessageBox.Yes
    panel.buttons["stop"].click()
    assert emitted == [("stop", "decode-0")]
    panel.buttons["restart"].click()
    assert emitted[-1] == ("restart", "decode-0") and len(asked) == 3
    assert not panel.ask("start", "decode-0")  # a ready worker cannot start: nothing asked or sent
    assert len(asked) == 3 and len(emitted) == 2


def test_start_and_reconfigure_need_no_confirmation(qtbot, monkeypatch):
    state = EngineState()
    send(state, "workers", workers=[worker("decode-0", "stopped")])
    panel = WorkersPanel(state)
    qtbot.addWidget(panel)
    panel.select_worker("decode-0")
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: pytest.fail("start must not ask"))
    with qtbot.waitSignal(panel.command_requested, timeout=1000) as blocker:
        panel.buttons["start"].click()
    assert blocker.args == ["start", "decode-0"]
    with qtbot.waitSignal(panel.reconfigure_requested, timeout=1000):
        panel.buttons["reconfigure"].click()


# ---- requests ----------------------------------------------------------------------------

def test_requests_table_rows_columns_and_filter(qtbot):
    state = EngineState()
    for slot in range(1, 4):
        send(state, "requests", **request(f"r{slot}", slot))
    send(state, "requests", **request("r1", 1, phase="finished"))  # r1 moves to the end of state.requests
    table = RequestsTable(state)
    qtbot.addWidget(table)
    model = table.model
    assert model.columnCount() == len(REQUEST_COLUMNS)
    assert [model.index(r, 0).data() for r in range(model.rowCount())] == ["r3", "r2"]  # active only
    assert [model.index(0, c).data() for c in range(7)] == ["r3", "t0", "103", "decoding",
                                                            "decode-0: 3, prefill-0: 2", "12.5", "3"]
    table.filter.setCurrentIndex(1)
    assert [model.index(r, 0).data() for r in range(model.rowCount())] == ["r3", "r2", "r1"]


def test_request_selection_signals(qtbot):
    state = EngineState()
    for slot in range(1, 6):
        send(state, "requests", **request(f"r{slot}", slot, phase="finished" if slot == 1 else "decoding"))
    table = RequestsTable(state)
    qtbot.addWidget(table)
    with qtbot.waitSignal(table.request_selected, timeout=1000) as blocker:
        table.view.selectRow(2)
    assert blocker.args == ["r3"]
    with qtbot.assertNotEmitted(table.request_selected):
        assert table.select_request("r1")  # finished: the filter switches to All
    assert table.selected_request() == "r1" and table.filter.currentIndex() == 1
    assert not table.select_request("nope")


def test_requests_table_5000_rows_inserts_instead_of_resetting(qtbot):
    state = EngineState()
    for slot in range(1, 5001):
        send(state, "requests", **request(f"r{slot}", slot))
    table = RequestsTable(state)
    qtbot.addWidget(table)
    assert table.model.rowCount() == 5000 and table.model.rows[0].request_id == "r5000"
    table.select_request("r10")
    resets, inserts = [], []
    table.model.modelReset.connect(lambda: resets.append(1))
    table.model.rowsInserted.connect(lambda parent, first, last: inserts.append((first, last)))
    send(state, "requests", **request("r10", 10, tokens=99))
    start = time.perf_counter()
    table.refresh()
    assert time.perf_counter() - start < 0.25
    assert resets == [] and table.model.index(table.model.row_of("r10"), 6).data() == "99"
    send(state, "requests", **request("r5001", 5001))
    table.refresh()
    assert inserts == [(0, 0)] and resets == [] and table.selected_request() == "r10"


# ---- metrics and status ------------------------------------------------------------------

def test_metrics_plots_curves_hold_the_recent_points(qtbot):
    state = EngineState()
    now = 1000.0
    for k in range(30):
        send(state, "metrics", at=now - 29 + k, tokens_per_s=100.0 + k, ttft_ms_p50=None if k < 10 else 40.0,
             tpot_ms_p50=8.0, queue_depth=k % 4, running=2,
             pools={"prefill-0": {"pages": 100, "used_pages": k}, "decode-0": {"pages": 200, "used_pages": 50}})
    plots = MetricsPlots(state, span_s=20.0)
    qtbot.addWidget(plots)
    plots.refresh(now)
    x, y = plots.curves["tokens_per_s"].getData()
    assert len(x) == 21 and x[-1] == 0.0 and x[0] == -20.0 and y[-1] == 129.0
    assert len(plots.curves["ttft_ms_p50"].getData()[0]) == 20  # None values are not points
    assert sorted(k for k in plots.curves if k.startswith("pool:")) == ["pool:decode-0", "pool:prefill-0"]
    assert plots.curves["pool:decode-0"].getData()[1][-1] == 25.0
    plots.set_stale(True)
    assert {p.opacity() for p in plots.plots.values()} == {STALE_OPACITY} and plots.toolTip()
    assert plots.graphicsEffect() is None  # an effect over a QGraphicsView crashed a later paint
    plots.set_stale(False)
    assert {p.opacity() for p in plots.plots.values()} == {1.0} and not plots.toolTip()


def test_metrics_axes_start_at_zero_in_their_unit_and_the_legend_is_off_the_curves(qtbot):
    """Issue 15, item 8: a queue of 0 read "requests (x0.001)" from -200 to 200, and the pool
    legend covered the plot and cut "prefill-0"."""
    state = EngineState()
    now = 1000.0
    for k in range(30):
        send(state, "metrics", at=now - 29 + k, tokens_per_s=0.0, queue_depth=0, ttft_ms_p50=None,
             tpot_ms_p50=None, running=0, pools={"prefill-0": {"pages": 83, "used_pages": 80 - k},
                                                 "decode-0": {"pages": 512, "used_pages": 500}})
    plots = MetricsPlots(state, span_s=60.0)
    qtbot.addWidget(plots)
    plots.resize(1000, 600)
    plots.show()
    plots.refresh(now)
    for name in ("queue_depth", "tokens_per_s", "ttft_ms_p50"):
        low, high = plots.plots[name].viewRange()[1]
        assert low == 0.0 and high >= 1.0, (name, low, high)
        axis = plots.plots[name].getAxis("left")
        assert axis.autoSIPrefixScale == 1.0 and "x0.001" not in axis.labelString(), axis.labelString()
    send(state, "metrics", at=now + 1, tokens_per_s=5000.0, queue_depth=7, running=2, ttft_ms_p50=None,
         tpot_ms_p50=None, pools={})
    plots.refresh(now + 1)
    assert plots.plots["queue_depth"].viewRange()[1][1] >= 7 and plots.plots["tokens_per_s"].viewRange()[1][1] >= 5000
    assert plots.plots["tokens_per_s"].getAxis("left").autoSIPrefixScale == 1.0
    names = [label.text for _sample, label in plots.legend.items]
    assert names == ["decode-0", "prefill-0"]
    box = plots.plots["pool_usage"].getViewBox()
    view = box.mapRectToScene(box.boundingRect())
    legend = plots.legend.mapRectToScene(plots.legend.boundingRect())
    assert not view.intersects(legend), (view, legend)


def test_status_line_reports_age_and_stale_transitions(qtbot):
    state = EngineState()
    line = StatusLine(state)
    qtbot.addWidget(line)
    changes = []
    line.stale_changed.connect(changes.append)
    line.set_endpoint("tcp://gpu-box:5555")
    line.set_connection("connected")
    send(state, "workers", at=100.0, workers=[])
    line.refresh(now=100.4)
    assert line.age_label.text() == "telemetry 0.4 s ago" and not line.stale
    assert line.stale_label.isHidden()
    line.refresh(now=110.0)
    line.refresh(now=111.0)
    assert line.stale and not line.stale_label.isHidden() and changes == [False, True]
    # fresh telemetry, but the engine stopped answering its control socket: stale too
    send(state, "workers", at=111.0, workers=[])
    line.refresh(now=111.1)
    assert not line.stale
    line.set_connection("reconnecting")
    line.refresh(now=111.2)
    assert line.stale and changes == [False, True, False, True]


@pytest.fixture
def restore_theme():
    app = QApplication.instance()
    palette, style = QPalette(app.palette()), app.style().name()
    yield app
    app.setStyle(style)
    app.setPalette(palette)


def test_theme_switch_sets_palette_and_restyles_plots(qtbot, restore_theme):
    app = restore_theme
    assert theme.apply_theme(app, "dark") == "dark"
    dark = app.palette().color(QPalette.Window)
    plots = MetricsPlots(EngineState())
    qtbot.addWidget(plots)
    assert plots.graphics.backgroundBrush().color().name() == theme.plot_colors("dark")[0]
    assert theme.apply_theme(app, "light") == "light"
    assert app.palette().color(QPalette.Window).lightness() > dark.lightness()
    assert theme.current_mode() == "light"
    qtbot.waitUntil(lambda: plots.graphics.backgroundBrush().color().name() == theme.plot_colors("light")[0],
                    timeout=2000)
    assert theme.apply_theme(app, "system") in ("dark", "light")
    with pytest.raises(ValueError, match="not one of"):
        theme.apply_theme(app, "sepia")



def test_the_faults_banner_names_every_defence_off_and_fault_on(qtbot):
    from gui.widgets.faults_banner import FaultsBanner

    state = EngineState()
    banner = FaultsBanner(state)
    qtbot.addWidget(banner)
    config = EngineConfig().to_dict()
    state.apply_status({"config": config})
    banner.refresh()
    assert banner.isHidden() and banner.shown_lines() == []  # every defence on, no fault
    config["defences"].update(writer_tag_check=False, scrub=False)
    config["faults"]["skip_scrub"] = True
    state.apply_status({"config": config})
    banner.refresh()
    lines = banner.shown_lines()
    assert not banner.isHidden() and lines[0].startswith("Defences OFF: Writer-tag check (I1)")
    assert "Scrub (I5)" in lines[0] and lines[1] == "Faults ON: skip scrub"


def test_the_faults_banner_names_an_invariant_switched_off_by_an_engine_key():
    from gui.widgets.faults_banner import weakened

    off, on = weakened({"engine": {"ownership_policy": "report_only", "scrub_policy": "none"}, "defences": {},
                        "faults": {}})
    assert on == [] and any("I1" in line and "report_only" in line for line in off)
    assert any("I5" in line and "scrub_policy = none" in line for line in off)
    assert weakened({"engine": {"ownership_policy": "abort", "scrub_policy": "zero"}}) == ([], [])
