"""After the engine restarts and the app reconnects, the operator's state stays: crossed data
nobody acknowledged is still announced, and the restart is marked where it happened: a gap
and a line in the metric plots, a row in the alerts."""

from __future__ import annotations

import numpy as np

from gui.model.alert_rows import MARKER_KIND
from gui.widgets.metrics_plots import GAP_S
from tests.gui.conftest import free_port
from tests.gui.incident_engine import IncidentEngine
from tests.gui.waits import connected_and_ready


def test_a_restart_keeps_unacknowledged_crossings_and_is_marked_on_plots_and_alerts(open_window, qtbot, tmp_path):
    incident = IncidentEngine(tmp_path, bind=f"tcp://127.0.0.1:{free_port()}")
    try:
        window = open_window(incident.control)
        incident.wave()
        qtbot.waitUntil(lambda: window.state.crossings.unacknowledged > 0 and any(
            a.kind == "ownership_violation" for a in window.state.alerts.values()), timeout=60_000)
        qtbot.waitUntil(lambda: len(window.state.metrics["queue_depth"]) >= 3, timeout=30_000)
        window.refresh()
        assert window.crossing_banner.isVisible()
        unacknowledged = window.state.crossings.unacknowledged
        started = window.state.engine["started"]

        incident.kill()
        qtbot.waitUntil(lambda: bool(window.state.stale), timeout=30_000)
        incident.start()  # the same address, a new run
        qtbot.waitUntil(lambda: window.state.engine.get("started") not in (None, started)
                        and connected_and_ready(window), timeout=180_000)
        qtbot.waitUntil(lambda: bool(window.state.restarts) and sum(
            1 for t, _ in window.state.metrics["queue_depth"] if t > window.state.restarts[-1].monotonic) >= 2,
            timeout=30_000)
        window.refresh()

        # the pairs nobody acknowledged are still announced, as the previous run's
        assert window.state.run_number == 1 and len(window.state.restarts) == 1
        assert window.state.crossings.unacknowledged >= unacknowledged
        assert window.crossing_banner.isVisible()
        assert "before the engine restarted" in window.crossing_banner.shown_lines()[0]
        # the alerts: a row that says when, the earlier ones marked as the previous engine's
        markers = [a for a in window.state.alerts.values() if a.marker]
        assert [a.kind for a in markers] == [MARKER_KIND] and "engine restarted at" in markers[0].detail
        # marked as gone: by this window (previous engine) or by the engine itself (previous run, from its journal)
        assert any(a.gone and a.kind == "ownership_violation" for a in window.state.alerts.values())
        table = window.alerts_table
        row = next(i for i, a in enumerate(table.model.rows) if a.marker)
        assert table.model.data(table.model.index(row, 6)) == "engine restarted"
        table.view.selectRow(row)
        assert not table.acknowledge_button.isEnabled()
        assert "Engine restarted" in window.alert_detail.view.toPlainText()
        # the plots: a vertical line where the new run started, and no line drawn across the outage
        for name, lines in window.metrics.restart_lines.items():
            assert len(lines) == 1 and lines[0].angle == 90, name
        line_x = window.metrics.restart_lines["queue_depth"][0].value()
        curve = window.metrics.curves["queue_depth"]
        x, y = np.asarray(curve.xData), np.asarray(curve.yData)
        finite = ~np.isnan(y)
        assert (x[finite] < line_x).any() and (x[finite] > line_x).any()
        assert np.isnan(y).any()
        drawn = finite[:-1] & finite[1:]  # segments pyqtgraph draws with connect="finite"
        assert (np.diff(x)[drawn] <= GAP_S).all(), "a straight line across the outage"
    finally:
        incident.stop()
