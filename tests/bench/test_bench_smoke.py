"""bench/serving.py must keep working: run it small, as a subprocess."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine.config import REPO_ROOT

pytestmark = pytest.mark.e2e  # real engine processes


def test_serving_bench_quick():
    proc = subprocess.run([sys.executable, "bench/serving.py", "--quick"], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| TTFT, 256-token prompt (best) |" in proc.stdout
    assert "kill -9 of a decode worker" in proc.stdout and "| cost |" in proc.stdout
