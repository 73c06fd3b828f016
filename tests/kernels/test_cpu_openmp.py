"""The C++ module runs on torch's threads: it is built with OpenMP (at::parallel_for is inline
OpenMP in ATen's headers; without it every kernel ran on one thread whatever
torch.set_num_threads said), it shares torch's one OpenMP runtime, and a build that brings a
second runtime is refused (the torch references run, and say why)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from kernels import cpu_extension


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs binutils' nm")
def test_the_module_opens_parallel_regions_through_openmp(built):
    undefined = subprocess.run(["nm", "-D", "--undefined-only", built.__file__], capture_output=True, text=True,
                               check=True).stdout
    assert "GOMP_parallel" in undefined, "built without -fopenmp: at::parallel_for runs on one thread"


def test_one_openmp_runtime_torchs(built):
    runtimes = cpu_extension.openmp_runtimes()
    assert len(runtimes) == 1 and "torch" in runtimes[0], runtimes


def test_a_build_that_brings_a_second_runtime_is_refused(monkeypatch, built):
    cpu_extension.extension.cache_clear()
    monkeypatch.setattr(cpu_extension, "openmp_runtimes", lambda: ["/x/torch/lib/libgomp.so.1", "/usr/lib/libomp.so"])
    monkeypatch.setattr(cpu_extension, "_failure", [])
    assert cpu_extension.extension() is None
    assert "a second OpenMP runtime beside torch's: /x/torch/lib/libgomp.so.1, /usr/lib/libomp.so" in \
        cpu_extension.build_failure()
