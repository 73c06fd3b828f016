"""Incident snapshots end to end: reproduce the incident on a real engine, export from the
window, reopen the bundle in the window, and compare with the live engine; damaged
bundles are refused or flagged, never a crash."""

from __future__ import annotations

import os
import random
import shutil
import zipfile

import numpy as np
import pytest
from PySide6.QtWidgets import QFileDialog, QMessageBox

from engine.guard.reproduce import run_workload
from engine.guard.scenarios import SCENARIOS, config_sections
from gui.snapshot.bundle import read_bundle
from tests.gui.waits import connected_and_ready

ALERT_KEYS = ("id", "kind", "state", "count", "requests", "pages", "first_seen", "severity")



@pytest.fixture
def no_dialogs(monkeypatch):
    shown = []
    for kind in ("critical", "warning", "information"):
        monkeypatch.setattr(QMessageBox, kind, lambda *args, kind=kind: shown.append((kind, args[2])))
    return shown


def test_export_reopen_equals_the_live_engine(start_server, open_window, qtbot, tmp_path, no_dialogs, monkeypatch):
    scenario = SCENARIOS["incident-placeholder"]
    sections = config_sections(scenario)
    sections["canaries"] = {"enabled": False}  # nothing may change between export and comparison
    sections["defences"] = {"manifest_check": False, "writer_tag_check": False}
    server = start_server("--allow-faults", **sections)
    client = server.client(timeout_s=300)
    run_workload(client, scenario.workload(random.Random(3), 0.25))
    window = open_window(server.control)
    qtbot.waitUntil(lambda: any(a.kind == "ownership_violation" for a in window.state.alerts.values()),
                    timeout=20_000)

    path = str(tmp_path / "incident.zip")
    assert window.export_snapshot(path)
    qtbot.waitUntil(lambda: window.export_job is None, timeout=120_000)
    assert window.last_export == path, no_dialogs
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".part")]  # the temporary file went

    # Cancel (issue 15, item 1): the job stops at its next step, writes nothing, and the
    # window can export again. The job is held at its first question until Cancel is pressed.
    import threading

    import gui.snapshot_view as snapshot_view

    pressed, real = threading.Event(), snapshot_view.TransportClient

    class HeldClient(real):
        def call_with_arrays(self, *args, **kwargs):
            pressed.wait(30)
            return super().call_with_arrays(*args, **kwargs)

    monkeypatch.setattr(snapshot_view, "TransportClient", HeldClient)
    cancelled_path = tmp_path / "cancelled.zip"
    assert window.export_snapshot(str(cancelled_path))
    assert not window.export_action.isEnabled() or window.export_job is not None
    from PySide6.QtWidgets import QPushButton
    window.export_progress.findChild(QPushButton).click()  # the dialog's Cancel button, as an operator clicks it
    pressed.set()
    qtbot.waitUntil(lambda: window.export_job is None, timeout=60_000)
    monkeypatch.setattr(snapshot_view, "TransportClient", real)
    assert not cancelled_path.exists() and not [p for p in os.listdir(tmp_path) if p.endswith(".part")]
    assert "export cancelled" in window.message_area.message() and window.last_export == path
    assert not no_dialogs  # a cancel is not an error

    # the bundle equals the live engine
    status = client.status()
    live_pairs = client.call("scope")["pairs"]
    opened = read_bundle(path)
    assert opened.verified, opened.warnings
    assert live_pairs and opened.state["scope"]["pairs"] == live_pairs
    for pool, arrays in opened.pages.items():
        truth = client.page_metadata(pool)
        assert all(np.array_equal(arrays[k], truth[k]) for k in truth), pool
    assert sorted(opened.pages) == sorted(w["pool"]["name"] for w in status["workers"])
    assert ([{k: a.get(k) for k in ALERT_KEYS} for a in opened.state["alerts"]]
            == [{k: a.get(k) for k in ALERT_KEYS} for a in status["alerts"]])
    names = {f["name"] for f in opened.manifest["files"]}
    assert {"state.json", "pages.npz", "metrics.csv", "events.jsonl", "trace.json", "report.html",
            *(f"pagemap-{p}.png" for p in opened.pages)} <= names

    # from an alert's context menu: the bundle's window starts a minute before the alert
    alert = next(a for a in window.state.alerts.values() if a.kind == "ownership_violation")
    alert_path = str(tmp_path / "alert.zip")
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *args, **kwargs: (alert_path, "*.zip"))
    window.export_alert_snapshot(alert.id)
    qtbot.waitUntil(lambda: window.export_job is None, timeout=120_000)
    assert window.last_export == alert_path
    assert read_bundle(alert_path).manifest["window"]["since"] == pytest.approx(alert.first_seen - 60.0)

    # reopened in the window: the same pages, alerts and affected pairs, read-only
    assert window.open_snapshot(path)
    assert window.snapshot_banner.isVisible() and window.snapshot_banner.verified
    # the live engine is only listened to meanwhile (Close returns to its session as it was)
    assert window.source.live_state is not None and window.request("canary") is None
    assert not window.reconfigure_action.isEnabled()
    assert not window.canary_action.isEnabled() and not window.export_action.isEnabled()
    assert not window.banner.reconfigure_button.isEnabled() and not window.alerts_table.acknowledge_button.isEnabled()
    assert "snapshot taken" in window.status_line.age_label.text() and not window.status_line.stale_label.isVisible()
    for pool, arrays in opened.pages.items():
        mirror = window.state.pages.pools[pool].arrays
        assert all(np.array_equal(mirror[k], arrays[k]) for k in arrays)
    assert set(window.state.alerts) == {a.get("key") or a["id"] for a in status["alerts"]}
    window.refresh()
    window.bottom_tabs.setCurrentIndex(1)
    model = window.alerts_table.model
    row = next(i for i, a in enumerate(model.rows) if a.kind == "ownership_violation")
    window.alerts_table.view.selectRow(row)
    qtbot.waitUntil(lambda: bool(window.alert_detail.pairs), timeout=5_000)
    readers = {p["reader"] for p in live_pairs}
    assert {p["reader"] for p in window.alert_detail.pairs} <= readers
    window.grab().save(os.environ.get("SNAPSHOT_PNG", str(tmp_path / "reopened.png")))

    # an edited bundle opens under a warning naming the file
    edited = tmp_path / "edited.zip"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(edited, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename == "state.json":
                data = data + b"\n"  # still valid JSON, but not what was exported
            dst.writestr(info, data)
    assert window.open_snapshot(str(edited))
    assert not window.snapshot_banner.verified
    assert "state.json does not match its sha256" in " ".join(window.snapshot_banner.shown_lines())

    # a truncated bundle is refused with the reason; the window keeps what it showed
    truncated = tmp_path / "truncated.zip"
    shutil.copy(path, truncated)
    with open(truncated, "r+b") as f:
        f.truncate(os.path.getsize(truncated) // 2)
    assert not window.open_snapshot(str(truncated))
    assert no_dialogs and no_dialogs[-1][0] == "critical" and "truncated" in no_dialogs[-1][1]
    assert window.source.snapshot is not None and window.source.snapshot.path == edited

    # Close Snapshot returns to the engine that was attached (issue 15, item 6), with no trace
    # of the snapshot's scope beside its live alerts
    window.close_snapshot()
    assert window.source.snapshot is None and not window.snapshot_banner.isVisible()
    assert window.banner.reconfigure_button.isEnabled()  # read-only came with the snapshot, and went
    assert window.source.transport is not None and window.source.now.label == server.control
    qtbot.waitUntil(lambda: connected_and_ready(window), timeout=60_000)
    assert not window.alert_detail.pairs and "affected pair" not in window.alert_detail.view.toPlainText()
    assert f"PageWarden — {server.control}" in window.windowTitle() and window.export_action.isEnabled()
    assert set(window.state.alerts) >= {a.get("key") or a["id"] for a in status["alerts"]}  # live again
