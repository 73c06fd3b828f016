"""Issue 15, item 5: what a dead engine last said is shown as last known, never as live;
a stopped worker's pages are greyed; after another engine answers at the same address,
the alerts of the one before are marked as its own (this window cannot acknowledge them), or,
read back from the new engine's journal, as its previous run's."""

from __future__ import annotations

import os
import signal

from PySide6.QtCore import Qt

from gui import theme
from gui.widgets.page_map import STOPPED_OPACITY
from tests.gui.conftest import free_port
from tests.gui.waits import connected_and_ready


def _worker_cells(window, column: int, role=Qt.DisplayRole) -> list:
    model = window.workers_panel.model
    return [model.data(model.index(i, column), role) for i in range(len(model.rows))]


def test_a_dead_engine_reads_as_last_known_and_its_alerts_as_the_previous_engines(start_server, open_window,
                                                                                  qtbot):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    first = start_server(bind=endpoint)
    window = open_window(first.control)
    client = first.client()
    started = client.status()["engine"]["started"]
    decode_pid = next(w["pid"] for w in client.status()["workers"] if w["name"] == "decode-0")
    os.kill(decode_pid, signal.SIGKILL)  # an alert on the first engine
    qtbot.waitUntil(lambda: any(a.kind == "worker_crashed" for a in window.state.alerts.values()), timeout=60_000)
    # restarted by the policy: ready again *with another pid* (the crash alert can arrive before
    # the workers list says crashed, and "ready" then is the list from before the crash)
    qtbot.waitUntil(lambda: connected_and_ready(window) and all(
        w.state == "ready" and w.pid not in (None, decode_pid) for w in window.state.workers if w.name == "decode-0"),
        timeout=120_000)
    window.refresh()
    assert _worker_cells(window, 2) == ["ready", "ready"]
    live_pids = _worker_cells(window, 3)

    first.kill()  # kill -9 of serve: its workers die with it
    qtbot.waitUntil(lambda: window.state.stale, timeout=30_000)
    window.refresh()
    assert _worker_cells(window, 2) == ["ready?", "ready?"]  # last known, not "ready"
    assert _worker_cells(window, 3) == [f"({pid})" for pid in live_pids]
    muted = theme.color("muted")
    assert all(c == muted for c in _worker_cells(window, 2, Qt.ForegroundRole))
    assert "no answer from the engine" in _worker_cells(window, 0, Qt.ToolTipRole)[0].lower()
    titles = [view.title_text for view in window.page_map._views.values()]
    assert titles and all("last known pages" in t for t in titles)

    second = start_server(bind=endpoint)  # another engine at the same address
    qtbot.waitUntil(lambda: window.state.engine.get("started") not in (None, started)
                    and connected_and_ready(window), timeout=120_000)
    window.refresh()
    assert _worker_cells(window, 2) == ["ready", "ready"]
    # the first engine's alerts: marked by this window (previous engine), or, where the new
    # engine read them back from its journal, by the engine (previous run), never as live
    old = [a for a in window.state.alerts.values() if a.kind == "worker_crashed"]
    assert old and all(a.previous_engine and a.id.startswith("previous:") or a.previous_run for a in old)
    assert not any(a.live_firing for a in old)
    window.bottom_tabs.setCurrentIndex(1)
    table = window.alerts_table
    row = next(i for i, a in enumerate(table.model.rows) if a.gone)
    gone = table.model.rows[row]
    state_cell = table.model.data(table.model.index(row, 6))
    assert ("previous engine" if gone.previous_engine else "previous run") in state_cell
    table.view.selectRow(row)
    # nobody left to ask about a gone engine's alert; the new run acknowledges its journal's by key
    assert table.acknowledge_button.isEnabled() == (gone.previous_run and not gone.acked)

    # a stopped worker's map: greyed, titled as its last known pages
    second.client().call("stop", worker="decode-0")
    qtbot.waitUntil(lambda: any(w.name == "decode-0" and w.state == "stopped" for w in window.state.workers),
                    timeout=60_000)
    window.refresh()
    view = window.page_map._views["decode-0"]
    assert "worker stopped: last known pages" in view.title_text
    assert view.item.opacity() == STOPPED_OPACITY
    assert window.page_map._views["prefill-0"].item.opacity() == 1.0
