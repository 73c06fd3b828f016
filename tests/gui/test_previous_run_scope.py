"""An alert of the engine's previous run (read back from its evidence journal after a restart)
shows the scope of that run in the alert detail: the engine answers it from the journal, not
from the new run's empty memory."""

from __future__ import annotations

import time

import pytest

from tests.gui.conftest import free_port
from tests.gui.incident_engine import IncidentEngine

pytestmark = [pytest.mark.e2e, pytest.mark.gui]


def test_a_previous_runs_alert_shows_that_runs_scope(open_window, qtbot, tmp_path):
    incident = IncidentEngine(tmp_path, bind=f"tcp://127.0.0.1:{free_port()}")
    try:
        incident.wave()
        time.sleep(1.0)  # the crossings flushed to the journal
        first_run = incident.client.status()["engine"]["run"]
        live = {(p["source_slot"], p["reader_slot"]): p["reads"] for p in incident.client.call("scope")["pairs"]}
        assert live, "the wave crossed no data"
        incident.stop()
        incident.start()  # the same address and config: the same journal, a new run
        window = open_window(incident.control)
        qtbot.waitUntil(lambda: any(a.previous_run and a.kind == "ownership_violation"
                                    for a in window.state.alerts.values()), timeout=60_000)
        old = next(a for a in window.state.alerts.values() if a.previous_run and a.kind == "ownership_violation")
        assert old.run == first_run
        table = window.alerts_table  # the operator clicks the earlier run's alert
        window.refresh()
        row = next(i for i, a in enumerate(table.model.rows) if a.id == old.id)
        table.view.selectRow(row)
        got = {}

        def scope_shown() -> bool:
            detail = window.alert_detail
            if detail.alert is not None and detail.alert.id == old.id and detail.pairs:
                got["pairs"] = list(detail.pairs)
            return bool(got)

        qtbot.waitUntil(scope_shown, timeout=30_000)
        shown = {(p["source_slot"], p["reader_slot"]): p["reads"] for p in got["pairs"]}
        assert shown and set(shown) <= set(live)
        assert all(shown[k] <= live[k] for k in shown)  # the episode's window of that run, never more
        assert incident.client.call("scope")["pairs"] == []  # the new run itself: nothing crossed
    finally:
        incident.stop()
