"""The window's chrome against a real engine: status messages that nothing covers, the title
that names the engine and its firing critical alerts, the workers' RESTARTS and AGE, and a
Reconfigure dialog that knows when the engine does not answer."""

from __future__ import annotations

import os
import signal

from PySide6.QtCore import QRect, Qt

from gui.widgets.workers_panel import AGE_COLUMN, RESTARTS_COLUMN
from tests.gui.waits import connected_and_ready


def _cell(window, worker: str, column: int) -> str:
    model = window.workers_panel.model
    row = next(i for i, w in enumerate(model.rows) if w.name == worker)
    return model.data(model.index(row, column))


def _on_screen(widget) -> QRect:
    return QRect(widget.mapTo(widget.window(), widget.rect().topLeft()), widget.size())


def test_messages_show_beside_the_status_line_and_the_title_names_engine_and_critical_alerts(
        start_server, open_window, qtbot):
    server = start_server(workers={"restart": "never"})
    window = open_window(server.control)
    window.resize(1024, 700)
    window.refresh()
    assert window.windowTitle().startswith(f"PageWarden — {server.control}")
    assert "critical firing" not in window.windowTitle()

    # a worker command the engine refuses: its reason must be readable in the status bar
    window.worker_command("start", "decode-0")
    qtbot.waitUntil(lambda: "start failed" in window.message_area.message(), timeout=20_000)
    area, line = window.message_area, window.status_line
    assert "only a stopped or crashed worker can start" in area.full_text()
    assert area.isVisible() and area.width() >= 200, area.geometry()
    assert not _on_screen(area).intersects(_on_screen(line)), (_on_screen(area), _on_screen(line))
    assert area.text().startswith("start failed")  # shown (elided at most), not only stored
    # whatever still asks the status bar itself lands there too
    window.statusBar().showMessage("Snapshot export cancelled; nothing was written to x.zip", 5000)
    assert area.message() == "Snapshot export cancelled; nothing was written to x.zip"
    assert window.statusBar().currentMessage() == ""  # not drawn a second time under the widgets

    # a crashed worker that stays down: a critical alert firing, counted in the title
    pid = next(w.pid for w in window.state.workers if w.name == "decode-0")
    os.kill(pid, signal.SIGKILL)
    qtbot.waitUntil(lambda: window.state.firing_critical() >= 1, timeout=60_000)
    qtbot.waitUntil(lambda: window.windowTitle().startswith("⚠ "), timeout=5_000)
    count = window.state.firing_critical()
    assert window.windowTitle().startswith(f"⚠ {count} critical firing — PageWarden — {server.control}")


def test_workers_show_restarts_and_age(start_server, open_window, qtbot):
    server = start_server()
    window = open_window(server.control)
    window.refresh()
    assert window.workers_panel.model.headerData(RESTARTS_COLUMN, Qt.Horizontal) == "Restarts"
    assert _cell(window, "decode-0", RESTARTS_COLUMN) == "0"
    assert _cell(window, "decode-0", AGE_COLUMN).endswith(("s", "m"))
    pid = next(w.pid for w in window.state.workers if w.name == "decode-0")
    os.kill(pid, signal.SIGKILL)
    qtbot.waitUntil(lambda: any(w.name == "decode-0" and w.restarts == 1 and w.state == "ready"
                                for w in window.state.workers), timeout=120_000)
    window.refresh()
    assert _cell(window, "decode-0", RESTARTS_COLUMN) == "1"
    assert _cell(window, "prefill-0", RESTARTS_COLUMN) == "0"
    young, old = (next(w for w in window.state.workers if w.name == n).age_s() for n in ("decode-0", "prefill-0"))
    assert young is not None and old is not None and young < old  # the restarted one is younger


def test_validate_is_off_while_the_engine_is_stale_and_times_out_with_a_reason(start_server, open_window, qtbot):
    server = start_server()
    window = open_window(server.control)
    window.open_reconfigure()
    dialog = window.reconfigure_dialog
    dialog.timeout_s = 1.0  # the test's own bound: the engine below never answers
    qtbot.waitUntil(lambda: dialog.validate_button.isEnabled(), timeout=5_000)
    dialog.context_window.setValue(dialog.context_window.value() // 2)
    os.kill(server.proc.pid, signal.SIGSTOP)  # the engine stops answering, its sockets stay open
    try:
        dialog.validate()  # sent at once: the window has not noticed the silence yet
        assert "Validating" in dialog.result_view.toPlainText()
        assert not dialog.validate_button.isEnabled()  # one question at a time
        qtbot.waitUntil(lambda: "No answer to Validate" in dialog.result_view.toPlainText(), timeout=30_000)
        assert "within 1 s" in dialog.result_view.toPlainText()
        qtbot.waitUntil(lambda: bool(window.state.stale), timeout=30_000)
        window.refresh()
        assert not dialog.validate_button.isEnabled() and not dialog.apply_button.isEnabled()
        assert "STALE" in dialog.validate_button.toolTip()
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
    qtbot.waitUntil(lambda: connected_and_ready(window) and not window.state.stale, timeout=60_000)
    window.refresh()
    assert dialog.validate_button.isEnabled()
    dialog.timeout_s = 60.0
    dialog.validate()
    qtbot.waitUntil(lambda: "Validating" not in dialog.result_view.toPlainText(), timeout=60_000)
    assert "No answer" not in dialog.result_view.toPlainText()
    dialog.reject()
