"""The GPU benchmark script runs end to end on tiny shapes (CPU, Triton interpreter)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("triton")

from engine.config import REPO_ROOT as REPO  # noqa: E402


def test_gpu_bench_smoke_prints_result_table(tmp_path):
    result_file = tmp_path / "results.json"
    proc = subprocess.run(
        [sys.executable, "bench/gpu_kernels.py", "--smoke", "--json", str(result_file)],
        cwd=REPO, capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "| batch | context | check on us | check off us |" in proc.stdout
    table_rows = [line for line in proc.stdout.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(table_rows) == 4, proc.stdout
    results = json.loads(result_file.read_text())
    assert len(results["rows"]) == 4 and all(r["max_rel_err"] < 1e-4 for r in results["rows"])
    # the KV block digest's table: each row checked bit for bit against the reference first
    assert "| view | blocks | digest us | copy us | digest GB/s |" in proc.stdout
    assert [(r["layout"], r["blocks"]) for r in results["digest_rows"]] == [
        ("K", 16), ("K", 64), ("K+V", 16), ("K+V", 64)]
