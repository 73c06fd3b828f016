"""bench/block_digest.py must keep working: run it small, as a subprocess."""

from __future__ import annotations

import subprocess
import sys

from engine.config import REPO_ROOT


def test_block_digest_bench_quick():
    proc = subprocess.run([sys.executable, "bench/block_digest.py", "--quick"], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| layout | blocks | MB digested | digest GB/s | copy GB/s | digest / copy |" in proc.stdout
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| K")]
    assert len(rows) == 3, proc.stdout
