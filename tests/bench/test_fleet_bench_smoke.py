"""bench/fleet_scale.py must keep working: a few generated targets, a real Prometheus."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

from engine.config import REPO_ROOT

pytestmark = pytest.mark.e2e  # a real Prometheus


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="apt install prometheus (.ci/run does)")
def test_fleet_bench_small():
    proc = subprocess.run([sys.executable, "bench/fleet_scale.py", "--engines", "6", "--scrape-s", "1",
                           "--refreshes", "2"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"6 targets, scrape every 1 s: 6 up", proc.stdout), proc.stdout
    assert re.search(r"Fleet refresh \(.+\): median \d+ ms", proc.stdout), proc.stdout


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="apt install prometheus (.ci/run does)")
def test_fleet_latency_bench_one_round():
    proc = subprocess.run([sys.executable, "bench/fleet_latency.py", "--scrape-s", "1", "--rounds", "1"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"round 1: first cross read -> top of the Fleet view [\d.]+ s .* kill -> down [\d.]+ s",
                     proc.stdout), proc.stdout
