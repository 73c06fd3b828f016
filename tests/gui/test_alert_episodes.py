"""Alert episodes in the app: every episode its own row (keyed by the engine's `key`), the
previous run's records marked, lists that the engine cut said so, and an engine restart
detected by its start time or its journal run."""

from __future__ import annotations

import os
import signal

import pytest

from engine.wire.protocol import Message
from gui.model.engine_state import EngineState
from gui.widgets.alert_detail import AlertDetail
from gui.widgets.alerts_table import AlertsTable, short_list
from tests.gui.waits import connected_and_ready


def alert(**fields) -> Message:
    record = {"id": "worker_crashed:decode-0", "kind": "worker_crashed", "severity": "critical", "state": "firing",
              "first_seen": 100.0, "last_seen": 100.0, "count": 1, "requests": [], "pages": [], "detail": "x"}
    return Message({"topic": "alerts", **record, **fields})


def status(started: float, run: str | None = None, **engine) -> dict:
    out = {"engine": {"control": "tcp://127.0.0.1:5650", "started": started, **engine}, "workers": [],
           "capacity": []}
    if run is not None:
        out["evidence"] = {"run": run}
    return out


def test_every_episode_is_a_row_and_the_previous_runs_are_marked(qtbot):
    state = EngineState()
    state.apply(alert(key="worker_crashed:decode-0#1", episode=1, state="resolved", requests=["r1"]))
    state.apply(alert(key="worker_crashed:decode-0#2", episode=2, first_seen=200.0, last_seen=200.0,
                      requests=["r2"]))
    state.apply(alert(key="worker_crashed:decode-0#2", episode=2, first_seen=200.0, last_seen=210.0, count=3,
                      requests=["r2"]))  # the same episode again: the same row
    assert list(state.alerts) == ["worker_crashed:decode-0#1", "worker_crashed:decode-0#2"]
    assert state.alerts["worker_crashed:decode-0#1"].requests == ["r1"]  # never overwritten by episode 2
    assert state.alerts["worker_crashed:decode-0#2"].count == 3
    assert state.alerts["worker_crashed:decode-0#2"].ack_id == "worker_crashed:decode-0#2"
    assert {a.alert_id for a in state.alerts.values()} == {"worker_crashed:decode-0"}
    state.apply(alert(id="canary_leak:x", kind="canary_leak", key="canary_leak:x#1", episode=1, previous_run=True))
    old = state.alerts["canary_leak:x#1"]
    assert old.previous_run and old.gone and not old.live_firing
    assert state.firing_critical() == 1  # the previous run's firing alert does not count

    table = AlertsTable(state)
    qtbot.addWidget(table)
    state.events.flush()
    cells = {row.id: table.model.data(table.model.index(i, 6)) for i, row in enumerate(table.model.rows)}
    assert cells["worker_crashed:decode-0#2"] == "firing ×3 · episode 2"
    assert cells["canary_leak:x#1"].endswith("· previous run")
    assert len(table.model.rows) == 3

    # a record without `key` (an engine before episodes) is keyed by its id, as before
    plain = EngineState()
    plain.apply(alert())
    assert list(plain.alerts) == ["worker_crashed:decode-0"] and plain.alerts["worker_crashed:decode-0"].episode is None


def test_a_cut_list_says_how_many_it_left_out_and_a_whole_one_says_nothing(qtbot):
    state = EngineState()
    requests = [f"r{i}" for i in range(50)]
    state.apply(alert(key="k#1", requests=requests, requests_total=570, pages=list(range(50)), pages_total=50))
    state.apply(alert(id="other", key="other#1", requests=["a", "b"]))  # no totals: nothing extra
    cut, whole = state.alerts["k#1"], state.alerts["other#1"]
    assert cut.requests_left_out == 520 and cut.pages_left_out == 0 and whole.requests_left_out == 0
    assert short_list(cut.requests, left_out=cut.requests_left_out).endswith("+567")
    detail = AlertDetail(state)
    qtbot.addWidget(detail)
    detail.show_alert(cut)
    assert "+520 more requests not listed" in detail.view.toPlainText()
    assert "more page" not in detail.view.toPlainText()
    detail.show_alert(whole)
    assert "more request" not in detail.view.toPlainText()


def test_a_restart_is_another_start_time_or_journal_run_and_a_brief_status_proves_nothing():
    state = EngineState()
    state.apply_status(status(1.0, "run-a"))
    state.apply(alert(key="k#1"))
    state.apply_status({"engine": {"control": "tcp://127.0.0.1:5650"}, "workers": []})  # brief, no start time
    state.apply_status(status(1.0))  # a status without the journal's run
    assert state.run_number == 0 and "k#1" in state.alerts
    state.apply_status(status(1.0, "run-b"))  # the same start time, another journal run
    assert state.run_number == 1 and state.alerts["previous:k#1"].previous_engine
    assert [a.kind for a in state.alerts.values() if a.marker] == ["engine_restarted"]
    state.apply_status(status(50.0, "run-c", uptime_s=2.0), now=1000.0)
    assert state.run_number == 2 and state.restarts[-1].monotonic == 998.0  # when the new run began
    # the journal gives back an earlier run's episode: it replaces the row this window retired
    state.apply(alert(key="k#1", previous_run=True))
    assert "previous:k#1" not in state.alerts and state.alerts["k#1"].previous_run


def test_episodes_of_a_real_engine_each_get_a_row(start_server, open_window, qtbot):
    """Two crashes of one worker are two episodes. Needs an engine that numbers them."""
    server = start_server()
    window = open_window(server.control)
    for n in (1, 2):
        pid = next(w.pid for w in window.state.workers if w.name == "decode-0")
        os.kill(pid, signal.SIGKILL)
        qtbot.waitUntil(lambda: any(w.name == "decode-0" and w.restarts == n for w in window.state.workers),
                        timeout=120_000)
        qtbot.waitUntil(lambda: connected_and_ready(window), timeout=120_000)
    crashes = [a for a in window.state.alerts.values() if a.kind == "worker_crashed"]
    if all(a.episode is None for a in crashes):
        pytest.skip("this engine does not number alert episodes yet (no `key` in its alert records)")
    assert sorted(a.episode for a in crashes) == [1, 2] and len({a.id for a in crashes}) == 2
