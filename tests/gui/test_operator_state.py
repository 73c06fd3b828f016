"""The app keeps the operator's state through what operators do during an incident: open a
snapshot and close it, follow an alert as it grows, look back in the history, read the
window at 1024x700 with every banner up. One real engine reproduces the incident for all."""

from __future__ import annotations

import time

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from tests.gui.incident_engine import IncidentEngine

MAP_MIN = (150, 110)  # px of every pool's page map at 1024x700


@pytest.fixture(scope="module")
def incident(tmp_path_factory):
    engine = IncidentEngine(tmp_path_factory.mktemp("incident"))
    yield engine
    engine.stop()


def _crossed(window, qtbot, incident, timeout_ms=60_000) -> None:
    """A wave, then wait until the window shows its crossed data."""
    before = window.state.crossings.pairs
    incident.wave()
    qtbot.waitUntil(lambda: window.state.crossings.pairs > before, timeout=timeout_ms)
    window.refresh()


def _settle(qtbot, ms: int = 200) -> None:
    qtbot.wait(ms)
    QApplication.processEvents()


def test_closing_a_snapshot_returns_to_the_live_session_as_it_was(incident, open_window, qtbot, tmp_path):
    window = open_window(incident.control)
    _crossed(window, qtbot, incident)
    assert window.crossing_banner.isVisible()
    window.crossing_banner.ack_button.click()
    window.refresh()
    acknowledged = window.state.crossings.acknowledged
    assert acknowledged > 0 and not window.crossing_banner.isVisible()
    qtbot.waitUntil(lambda: len(window.state.history) >= 2 and len(window.state.metrics["queue_depth"]) >= 3,
                    timeout=30_000)
    live = window.state
    frames, samples = len(live.history), len(live.metrics["queue_depth"])
    requests, alerts = set(live.requests), set(live.alerts)
    colours = window.page_map.colors

    path = tmp_path / "incident.zip"
    assert window.export_snapshot(str(path))
    qtbot.waitUntil(lambda: window.export_job is None, timeout=120_000)
    assert window.last_export == str(path), window.message_area.message()
    assert "Snapshot written to" in window.message_area.message()
    assert window.open_snapshot(str(path))
    assert window.state is not live and window.snapshot_banner.isVisible()
    assert window.request("canary") is None  # behind a snapshot the engine is only listened to

    window.close_snapshot()
    window.refresh()
    assert window.state is live and window.page_map.colors is colours  # the same session, the same colours
    assert len(live.history) >= frames and len(window.history_bar.state.history) >= frames
    assert len(live.metrics["queue_depth"]) >= samples and len(window.metrics.curves["queue_depth"].xData) >= samples
    assert requests <= set(live.requests) and alerts <= set(live.alerts)
    assert live.crossings.acknowledged == acknowledged and not window.crossing_banner.isVisible()
    qtbot.waitUntil(lambda: window.source.now.connected, timeout=10_000)
    assert window.status_line.connection_label.text() == "connected"


def test_the_alert_detail_follows_its_alert_and_says_when_a_list_is_cut(incident, open_window, qtbot):
    window = open_window(incident.control)
    _crossed(window, qtbot, incident)
    window.bottom_tabs.setCurrentIndex(1)
    qtbot.waitUntil(lambda: any(a.kind == "ownership_violation" and a.live_firing
                                for a in window.state.alerts.values()), timeout=30_000)
    window.refresh()
    model = window.alerts_table.model
    row = next(i for i, a in enumerate(model.rows) if a.kind == "ownership_violation" and a.live_firing)
    key = model.rows[row].id
    window.alerts_table.view.selectRow(row)
    assert window.alert_detail.alert.id == key
    count = window.state.alerts[key].count
    _crossed(window, qtbot, incident)  # the same episode grows
    qtbot.waitUntil(lambda: window.state.alerts[key].count > count, timeout=30_000)
    window.refresh()
    now = window.state.alerts[key]
    shown = window.alert_detail.view.toPlainText()
    table_cell = model.data(model.index(next(i for i, a in enumerate(model.rows) if a.id == key), 6))
    assert f"×{now.count:,}" in table_cell and f"{now.count:,}×" in shown, (table_cell, shown[:200])
    assert window.alert_detail.alert is now
    if now.requests_left_out:  # an engine that says how many requests the episode named in all
        assert f"+{now.requests_left_out:,} more request" in shown
    else:
        assert "more request" not in shown


def test_history_rewinds_the_requests_table_and_marks_requests_whose_data_crossed(incident, open_window, qtbot):
    window = open_window(incident.control)
    window.requests_table.filter.setCurrentIndex(1)  # All
    _crossed(window, qtbot, incident)
    first_wave = list(window.state.crossings.recent)
    qtbot.waitUntil(lambda: len(window.state.history) >= 1, timeout=10_000)
    moment = time.time()
    known_then = set(window.state.requests)
    _settle(qtbot, 300)
    _crossed(window, qtbot, incident)
    later = {rid for rid, r in window.state.requests.items() if r.arrival is not None and r.arrival > moment}
    assert later, "the second wave brought no request"

    assert window.history_bar.show_time(moment)
    frame_time = window.history_bar.frame.time
    assert window.state.rewind_to == frame_time
    window.refresh()
    table = window.requests_table
    shown = {r.request_id for r in table.model.rows}
    assert shown and not shown & later, "a request from after the moment shown"
    # The table shows what had arrived at the engine by the frame's time, by the engine's own
    # stamps: a request that arrived just before it may reach the app a moment after `moment`
    # (a canary did once, in a fresh-clone run), so "what the app knew at `moment`" is not the bound.
    assert all(r.arrival <= frame_time for r in table.model.rows)
    arrived = {rid for rid, r in window.state.requests.items() if r.arrival is not None and r.arrival <= frame_time}
    assert shown <= arrived
    assert known_then & shown, "none of what the app knew at the moment is shown"
    readers = {c.reader for c in first_wave if c.time <= frame_time and c.reader in shown}
    assert readers, "no reader of the first wave to mark"
    marked = {r.request_id for r in table.model.rows if str(table.model.data(table.model.index(
        table.model.row_of(r.request_id), 0))).startswith("⚠")}
    assert readers <= marked
    assert "as at" in table.count_label.text() and "crossed data" in table.count_label.text()

    window.history_bar.go_live()
    window.refresh()
    assert window.state.rewind_to is None and later & {r.request_id for r in table.model.rows}


def test_at_1024x700_banners_take_a_line_each_and_the_maps_keep_their_size(incident, open_window, qtbot):
    window = open_window(incident.control)
    window.resize(1024, 700)
    _crossed(window, qtbot, incident)
    qtbot.waitUntil(lambda: window.faults_banner.isVisible() and window.banner.isVisible()
                    and window.crossing_banner.isVisible(), timeout=30_000)
    banners = (window.crossing_banner, window.banner, window.faults_banner)
    assert all(len(b.shown_lines()) >= 1 for b in banners)
    assert len(window.crossing_banner.shown_lines()) > 1  # more than one line, shown as one
    _settle(qtbot, 500)
    window.refresh()
    one_line = {b.objectName(): b.height() for b in banners}
    assert all(h <= b.line_height() + 14 for b, h in zip(banners, one_line.values())), one_line
    for name, view in window.page_map._views.items():
        box = view.view.sceneBoundingRect()
        assert box.width() >= MAP_MIN[0] and box.height() >= MAP_MIN[1], (name, box)
    where = window.page_map.geometry()

    # new text in a banner (another wave) must not move the maps
    _crossed(window, qtbot, incident)
    _settle(qtbot)
    assert window.page_map.geometry() == where
    # a click shows every line of a banner, another click one line again
    banner = window.crossing_banner
    qtbot.mouseClick(banner, Qt.LeftButton)
    _settle(qtbot)
    assert banner.expanded and banner.lines.isVisible()
    assert banner.height() >= len([p for line in banner.shown_lines() for p in line.split("\n")]) * banner.line_height()
    qtbot.mouseClick(banner, Qt.LeftButton)
    _settle(qtbot)
    assert not banner.expanded and banner.height() == one_line[banner.objectName()]
    assert window.page_map.geometry() == where
    image = window.grab().toImage()
    assert image.width() == 1024 and not np.all(np.array(image.constBits()).size == 0)
