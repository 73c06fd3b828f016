"""The CPU attention under AddressSanitizer (tests/kernels/asan_attention.py): builds the
module with -fsanitize=address (about 2 minutes on 2 cores) and runs it in a process with
libasan preloaded, so a read or write outside any buffer stops it with ASan's report."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kernels import asan_attention

ROOT = Path(__file__).resolve().parents[2]


def libasan() -> str:
    compiler = shutil.which("gcc") or shutil.which("g++")
    if compiler is None:
        pytest.skip("no gcc: the CPU kernels are not built here (test_the_kernel_builds_on_this_machine says so)")
    path = subprocess.run([compiler, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    assert os.path.isabs(path) and os.path.exists(path), f"{compiler} has no AddressSanitizer runtime: {path!r}"
    return path


def test_attention_stays_inside_its_buffers_under_address_sanitizer(tmp_path):
    env = {**os.environ, "LD_PRELOAD": libasan(), "ASAN_OPTIONS": "detect_leaks=0:halt_on_error=1",
           "PYTHONPATH": str(ROOT)}
    env.pop("PAGEWARDEN_CPU_KERNELS", None)
    proc = subprocess.run([sys.executable, "-m", "tests.kernels.asan_attention", str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    report = proc.stderr[-6000:]
    assert "AddressSanitizer" not in proc.stderr, report
    assert proc.returncode == 0, report
    cases = len(asan_attention.HEAD_DIMS) * len(asan_attention.GROUPS) * len(asan_attention.LENGTHS)
    assert f"checked {cases * 2 * 2} calls" in proc.stdout, proc.stdout + report  # decode and prefill, both paths
