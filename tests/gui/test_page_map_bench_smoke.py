"""The page map benchmark runs end to end on small pools (offscreen) and prints its table."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_page_map_bench_quick_prints_the_table():
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    proc = subprocess.run([sys.executable, "bench/page_map.py", "--quick"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    out = proc.stdout
    assert "| step | median ms | p95 ms |" in out
    for step in ("apply delta", "index image update", "setImage", "paint", "frame (state update + render)"):
        assert f"| {step}" in out or f"| **{step}" in out, out
    rows = [line for line in out.splitlines() if line.startswith("| 20,480 |")]
    assert len(rows) == 1 and rows[0].rstrip().endswith(("met |", "missed |")), out
    assert "render check: 8/8 frames painted every pool; 8/8 frames changed the grabbed pixels" in out, out
