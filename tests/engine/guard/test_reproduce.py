"""`reproduce`: every scenario at a small size on real worker processes. With every
defence on no request reads another's data; with one off, every read that happens is
caught; incident scoping equals the ground truth; a clean run raises nothing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from engine.config import REPO_ROOT
from engine.guard.reproduce import run_scenario
from engine.guard.scenarios import SCENARIOS

pytestmark = pytest.mark.e2e  # real engine processes



@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_rows_hold(name, tmp_path):
    # seed 1 at this scale once killed the supervisor (a `writer: null` page beside a canary's page)
    results = run_scenario(name, scale=0.25, seed=1, workdir=tmp_path, log=lambda line: None)
    rows = {r.row: r for r in results}
    for r in results:
        assert r.passed, (name, r.row, r.why)
        assert r.scope_equal and r.missed == 0 and r.false_positives == 0
    assert rows["all on"].reads == 0
    if name == "incident-placeholder":
        assert rows["all on"].prevented > 0  # the over-long requests were stopped
        both = rows["manifest_check+writer_tag_check off"]  # the incident itself: it happens, all caught
        assert both.reads > 0 and both.caught.get("ownership_violation") == both.readers
        # the black-box view of the same incident: a victim's marker text in a reply only where a
        # read was recorded. Whether a reply carries one here depends on which freed pages the
        # placeholder got, i.e. on timing (a failure under load, issue 12); that it does when
        # the pages line up is tests/engine/guard/test_incident_black_box.py, without timing
        assert {leak["reader"] for leak in both.leaks} <= set(both.reader_ids)
        assert not any(r.leaks for r in results if r.row != both.row)  # a defence on: never
    if name == "stale-block-table":
        off = rows["writer_tag_check off"]
        assert off.reads > 0 and off.caught.get("ownership_violation") == off.readers  # happened, all caught


def test_reproduce_cli_json_and_exit_status(tmp_path):
    proc = subprocess.run([sys.executable, "main.py", "reproduce", "short-transfer", "--scale", "0.15", "--json"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    rows = report["scenarios"]["short-transfer"]
    assert report["passed"] and [r["row"] for r in rows][:2] == ["all on", "admission off"]
    bad = subprocess.run([sys.executable, "main.py", "reproduce", "nonsense"], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown scenario 'nonsense'" in bad.stderr
