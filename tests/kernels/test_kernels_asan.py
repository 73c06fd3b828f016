"""The CPU attention under AddressSanitizer (tests/kernels/asan_attention.py): builds the
module with -fsanitize=address (about 2 minutes on 2 cores, once per source version: the
build is kept beside torch's extension cache) and runs it in a process with the compiler's
libasan preloaded, so a read or write outside a buffer stops it with ASan's report."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from torch.utils.cpp_extension import get_default_build_root

from kernels import cpu_extension
from tests.kernels import asan_attention

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.asan


def asan_env() -> dict[str, str]:
    """The environment of a sanitized Python: the runtime of the compiler torch builds with
    ($CXX, else c++), preloaded. Skips where this machine cannot give one."""
    compiler = shutil.which(os.environ.get("CXX", "c++"))
    if compiler is None:
        pytest.skip("no C++ compiler: the CPU kernels are not built here (test_the_kernel_builds_on_this_machine)")
    runtime = subprocess.run([compiler, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    if not os.path.isabs(runtime):
        pytest.skip(f"{compiler} has no AddressSanitizer runtime installed (it answered {runtime!r})")
    env = {**os.environ, "LD_PRELOAD": runtime, "ASAN_OPTIONS": "detect_leaks=0:halt_on_error=1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("PAGEWARDEN_CPU_KERNELS", None)
    probe = subprocess.run([sys.executable, "-c", "pass"], env=env, capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:  # e.g. a kernel whose mmap randomness this libasan cannot map around
        pytest.skip(f"AddressSanitizer does not start here: {probe.stderr.strip()[-300:]}")
    return env


def build_directory() -> Path:
    path = Path(get_default_build_root()) / f"pagewarden_cpu_kernels_asan_{cpu_extension.build_key()}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def test_attention_stays_inside_its_buffers_under_address_sanitizer():
    env = asan_env()
    proc = subprocess.run([sys.executable, "-m", "tests.kernels.asan_attention", str(build_directory())], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=900)
    report = proc.stderr[-6000:]
    assert "ERROR: AddressSanitizer" not in proc.stderr, report
    assert proc.returncode == 0, report
    assert f"checked {asan_attention.calls()} calls" in proc.stdout, proc.stdout + report
