"""`snapshot --journal` from a dead engine reproduces the scope of the live export of the same
window: the same pairs, reads, pages and times, the same alert episodes, the same requests."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from engine.config import REPO_ROOT
from tests.engine.evidence.incident_run import incident_config, same_scope, start, submit_wave, wait_ends

pytestmark = pytest.mark.e2e


def _snapshot(*argv: str) -> None:
    done = subprocess.run([sys.executable, "main.py", "snapshot", *argv], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_journal_alone_rebuilds_the_live_snapshot_scope(tmp_path):
    from gui.snapshot.bundle import read_bundle

    journal = tmp_path / "evidence.sqlite"
    server = start(incident_config(tmp_path, journal))
    try:
        client = server.client(timeout_s=120)
        wait_ends(client, submit_wave(client, seed=5))
        time.sleep(1.0)  # the last crossings flushed (FLUSH_S) and committed
        _snapshot("--engine", server.control, "--out", str(tmp_path / "live.zip"))
    finally:
        server.kill()  # dead: from here on only the journal knows
        server.stop()  # (closes the clients)
    _snapshot("--journal", str(journal), "--out", str(tmp_path / "journal.zip"))
    live, dead = read_bundle(tmp_path / "live.zip").state, read_bundle(tmp_path / "journal.zip").state
    assert live["scope"]["pairs"], "the wave crossed no data: nothing was compared"
    assert same_scope(live["scope"]["pairs"], dead["scope"]["pairs"]) == []
    assert {a["key"] for a in live["alerts"]} == {a["key"] for a in dead["alerts"]}
    def ends(state):
        return {r["request_id"]: (r["phase"], bool(r.get("placeholder") or any(
            e["event"] == "placeholder" for e in r["events"]))) for r in state["requests"]}
    live_ends, dead_ends = ends(live), ends(dead)
    assert set(live_ends) == set(dead_ends)
    assert sum(p for _, p in live_ends.values()) == sum(p for _, p in dead_ends.values()) > 0
    assert {rid for rid, (phase, _) in live_ends.items() if phase == "finished"} == \
        {rid for rid, (phase, _) in dead_ends.items() if phase == "finished"}
