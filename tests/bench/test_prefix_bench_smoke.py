"""The prefix-cache benches must keep working: bench/prefix_check_cost.py run small, and
bench/vs_vllm.py's shared-prefix prompts (vLLM itself is the vLLM tier's)."""

from __future__ import annotations

import subprocess
import sys

from engine.config import REPO_ROOT


def test_prefix_check_cost_runs_small_and_prints_a_ratio():
    proc = subprocess.run([sys.executable, "bench/prefix_check_cost.py", "--batch", "2", "--steps", "2",
                           "--rounds", "1"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = proc.stdout.strip().splitlines()[-1].split("|")
    assert row[1].strip() == "2" and row[2].strip() == "64" and float(row[5]) > 0  # 2 requests x 32 shared pages


def test_shared_prefix_prompts_share_only_the_system_prompts():
    sys.path.insert(0, str(REPO_ROOT / "bench"))
    from vs_vllm import shared_prefix_prompts

    sets = shared_prefix_prompts(6, 2, 32, 127, seed=3)
    assert len(sets) == 3 and all(len(s) == 6 and all(len(p) == 576 for p in s) for s in sets)
    heads = {tuple(p[:512]) for s in sets for p in s}
    assert len(heads) == 3  # three system prompts, in every set
    tails = [tuple(p[512:]) for s in sets for p in s]
    assert len(set(tails)) == len(tails)  # every user part fresh, across the warm-up and the reps


def test_prefill_attention_bench_runs_small_and_checks_every_path_against_sdpa():
    """bench/prefill_attention.py checks each C++ path's answer against SDPA before it times
    it (a wrong answer stops the run), then prints one row per contender."""
    proc = subprocess.run([sys.executable, "bench/prefill_attention.py", "--threads", "1", "--reps", "1",
                           "--cases", "shared16", "plain16"], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith(("shared16", "plain16"))]
    assert len(rows) == 6 and {r[2] + (" " + r[3] if r[2] == "c++" else "") for r in rows} == {
        "sdpa", "c++ plain", "c++ vector"}
    assert all(float(r[-2]) > 0 for r in rows)  # GFLOP/s of a measured time
