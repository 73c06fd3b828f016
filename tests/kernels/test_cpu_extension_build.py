"""The CPU module's build: a builder killed mid-build must not hang every later process on
torch's lock file, and each virtual environment keeps a build of its own."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kernels import cpu_extension

REPO = cpu_extension.CSRC.parent.parent


@pytest.mark.skipif(cpu_extension.extension() is None, reason="the CPU module cannot be built here")
def test_a_lock_left_by_a_killed_builder_does_not_hang_the_next_process():
    from torch.utils.cpp_extension import _get_build_directory

    name = f"pagewarden_cpu_kernels_{cpu_extension.build_key()}"
    (cpu_extension.Path(_get_build_directory(name, verbose=False)) / "lock").touch()  # as a SIGKILLed builder leaves it
    # torch's loader waits on that file for ever; the module is built already, so this takes seconds
    done = subprocess.run([sys.executable, "-c", "from kernels.cpu_extension import extension; "
                           "assert extension() is not None"], cwd=REPO, timeout=600, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_each_interpreter_and_torch_builds_its_own(monkeypatch):
    mine = cpu_extension.build_key()
    monkeypatch.setattr(cpu_extension.sys, "prefix", "/elsewhere/.venv-vllm")
    assert cpu_extension.build_key() != mine
