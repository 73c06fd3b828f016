"""The transfer benchmark runs end to end on tiny sizes: two processes, tcp loopback."""

from __future__ import annotations

import subprocess
import sys

from engine.config import REPO_ROOT as REPO  # noqa: E402


def test_transfer_bench_quick_prints_the_table():
    proc = subprocess.run([sys.executable, "bench/transfer.py", "--quick"],
                          cwd=REPO, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-4000:]
    columns = "| pages | transfer | chunk | raw ZMQ GB/s | ours GB/s | lazy GB/s | ours/raw | lazy/raw | CPU s/GB"
    assert columns in proc.stdout
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| 2 MB pages") or line.startswith("| 32 KB")]
    assert len(rows) >= 2, proc.stdout
    assert all(line.rstrip().endswith(("met |", "missed |")) for line in rows), proc.stdout
