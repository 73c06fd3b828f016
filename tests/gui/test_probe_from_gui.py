"""Tools → Probe an OpenAI endpoint… against a real engine's HTTP endpoint: the window
(hosting nothing, offscreen) schedules the probe through its dialog's accept path, the
probe's thread talks HTTP to `serve --http-port 0` with the incident's fault injected, and
its findings show as critical `canary_marker_in_output` alerts in the alerts table. A URL
nobody answers becomes a `probe_error` warning and the window keeps running.

No sleeps: every check waits with qtbot.waitUntil (generous: a loaded 2-core machine)."""

from __future__ import annotations

import socket

import pytest
from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QDialogButtonBox

from gui.dialogs.probe_dialog import ProbeDialog
from gui.main_window import MainWindow
from tests.engine.adapters.test_probe import FAULTS, SMALL

PROBE_TIMEOUT_MS = 600_000


@pytest.fixture
def window(qtbot, tmp_path):
    QSettings().remove("probe/last")
    window = MainWindow(theme="dark")
    qtbot.addWidget(window)
    window.show()
    yield window
    window.stop_probe()
    window.close()


def schedule_through_dialog(qtbot, window: MainWindow, url: str, rounds: int) -> ProbeDialog:
    window.probe_action.trigger()
    dialog = window.probe_dialog
    qtbot.waitUntil(dialog.isVisible, timeout=10_000)
    dialog.url.setText(url)
    dialog.rounds.setValue(rounds)
    ok = dialog.buttons.button(QDialogButtonBox.StandardButton.Ok)
    assert ok.isEnabled(), dialog.error.text()
    ok.click()
    assert not dialog.isVisible() and window.probe is not None
    return dialog


def alerts_of(window: MainWindow, kind: str) -> list:
    return [a for a in window.state.alerts.values() if a.kind == kind]


def test_the_probe_from_the_gui_finds_the_placeholder_leak(qtbot, window, start_server):
    server = start_server("--allow-faults", "--http-port", "0", faults=FAULTS,
                          defences={"manifest_check": False, "writer_tag_check": False}, **SMALL)
    url = server.ready["http"]
    schedule_through_dialog(qtbot, window, url, rounds=2)
    assert window.stop_probe_action.isEnabled() and window.probe_status.isVisible()
    qtbot.waitUntil(lambda: bool(alerts_of(window, "canary_marker_in_output")), timeout=PROBE_TIMEOUT_MS)
    qtbot.waitUntil(lambda: not window.probe.active, timeout=PROBE_TIMEOUT_MS)  # once: the run ends
    findings = alerts_of(window, "canary_marker_in_output")
    assert all(a.severity == "critical" and a.state == "firing" for a in findings)
    head = findings[0].detail.splitlines()[0]
    assert head.startswith(url) and "round " in head and "follow-up " in head and "marker '" in head
    assert not alerts_of(window, "probe_error"), [a.detail for a in alerts_of(window, "probe_error")]
    # in the table and the status line
    qtbot.waitUntil(lambda: any(r.kind == "canary_marker_in_output" for r in window.alerts_table.model.rows),
                    timeout=10_000)
    text = window.probe_status.text()
    assert text.startswith("probe: 2 rounds, ") and f"{len(findings)} finding" in text and text.endswith("done")
    assert not window.stop_probe_action.isEnabled()
    # a local alert is acknowledged in the window (the engine never saw it)
    window.acknowledge_alerts([findings[0].id])
    assert window.state.alerts[findings[0].id].acked
    assert QSettings().value("probe/last")[0] == url  # the next dialog starts from it
    window.probe_action.trigger()
    assert window.probe_dialog.url.text() == url
    window.probe_dialog.reject()


def test_an_unreachable_url_is_a_probe_error_and_the_window_keeps_running(qtbot, window):
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    schedule_through_dialog(qtbot, window, url, rounds=1)
    qtbot.waitUntil(lambda: bool(alerts_of(window, "probe_error")), timeout=60_000)
    (error,) = alerts_of(window, "probe_error")
    assert error.severity == "warning" and error.detail.startswith(f"{url}: cannot reach")
    assert not alerts_of(window, "canary_marker_in_output")
    qtbot.waitUntil(lambda: window.probe_status.text() == "probe: 0 rounds, 0 findings, 1 error · done",
                    timeout=10_000)
    assert window.isVisible()
    # a remote host is refused in the dialog, naming it, until allowed
    window.probe_action.trigger()
    dialog = window.probe_dialog
    dialog.url.setText("http://10.1.2.3:8000")
    ok = dialog.buttons.button(QDialogButtonBox.StandardButton.Ok)
    assert not ok.isEnabled() and "URL host 10.1.2.3 is not loopback" in dialog.error.text()
    dialog.rounds.setValue(0)
    dialog.allow_remote.setChecked(True)
    assert not ok.isEnabled() and dialog.error.text() == "Rounds 0 is outside 1..50"
    dialog.rounds.setValue(1)
    assert ok.isEnabled()
    dialog.reject()


def test_the_probe_works_in_the_kv_event_mode_too(qtbot, window):
    """The action is there while the window watches vLLM / SGLang events, and its alerts
    bring the (otherwise hidden) alerts dock back."""
    from engine.adapters.kv_attach import check_kv_attach
    from gui.model.source import Kind

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    window.attach_kv_events(check_kv_attach([f"tcp://127.0.0.1:{port}"]))
    assert window.source.now.kind is Kind.KV_EVENTS and window.probe_action.isVisible() and window.probe_action.isEnabled()
    schedule_through_dialog(qtbot, window, f"http://127.0.0.1:{port}", rounds=1)
    qtbot.waitUntil(lambda: any(r.kind == "probe_error" for r in window.alerts_table.model.rows), timeout=60_000)
    assert window.bottom_tabs.isVisible()


def salt_check_through_dialog(qtbot, window: MainWindow, url: str, pairs: int) -> ProbeDialog:
    window.probe_action.trigger()
    dialog = window.probe_dialog
    qtbot.waitUntil(dialog.isVisible, timeout=10_000)
    dialog.url.setText(url)
    dialog.salt_check.setChecked(True)
    assert not dialog.rounds.isEnabled() and dialog.pairs.isEnabled()
    dialog.pairs.setValue(1)
    ok = dialog.buttons.button(QDialogButtonBox.StandardButton.Ok)
    assert not ok.isEnabled() and dialog.error.text() == "Pairs 1 is outside 2..64"
    dialog.pairs.setValue(pairs)
    assert ok.isEnabled(), dialog.error.text()
    ok.click()
    assert dialog.isVisible() and dialog.salt_running and not ok.isEnabled()  # stays open for its verdict
    assert dialog.salt_result.text().startswith("Running the salt check")
    return dialog


@pytest.mark.parametrize("mode", ["share", "isolate"])
def test_the_salt_check_from_the_dialog_shows_its_verdict_and_alerts_on_sharing(qtbot, window, mode):
    """Off the GUI thread (the window's probe thread), the verdict shown in the dialog; salts
    sharing the cache is a critical local alert, isolation none."""
    from engine.adapters.salt_check import HOLDS, SHARED
    from gui.model.probe_schedule import SALT_SHARED_KIND
    from tests.engine.adapters.fake_cache_server import FakeCacheServer

    with FakeCacheServer(mode) as server:
        dialog = salt_check_through_dialog(qtbot, window, server.url, pairs=4)
        qtbot.waitUntil(lambda: not dialog.salt_running, timeout=120_000)
        assert len(server.bodies) == 1 + 4 * 4
    verdict = SHARED if mode == "share" else HOLDS
    text = dialog.salt_result.text()
    assert text.startswith(f"salt check {server.url} model fake-copy: {verdict}"), text
    assert "cached_tokens: same salt hit 4 of 4" in text and "same-salt seconds vs cold: D " in text
    assert dialog.buttons.button(QDialogButtonBox.StandardButton.Ok).isEnabled()  # may run again
    qtbot.waitUntil(lambda: not window.probe.active, timeout=10_000)
    assert window.probe_status.text() == f"salt check: {verdict} · done"
    shared = alerts_of(window, SALT_SHARED_KIND)
    assert not alerts_of(window, "probe_error"), [a.detail for a in alerts_of(window, "probe_error")]
    if mode == "share":
        (alert,) = shared
        assert alert.severity == "critical" and alert.detail.startswith(f"salt check {server.url}")
        assert "crosses tenants" in alert.detail
        qtbot.waitUntil(lambda: any(r.kind == SALT_SHARED_KIND for r in window.alerts_table.model.rows),
                        timeout=10_000)
    else:
        assert not shared
    dialog.reject()
