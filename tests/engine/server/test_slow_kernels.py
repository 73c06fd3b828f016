"""A worker that cannot build the CPU module runs the slow torch references: it says so in its
hello, the supervisor raises `slow_kernels` (status, the GUI's alerts) naming why, and the
engine serves on. A process told to run the references on purpose raises nothing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine.client.local_server import LocalServer, write_config
from kernels import cpu_extension

REPO = cpu_extension.CSRC.parent.parent
NO_COMPILER = {"CXX": "/bin/false"}  # torch's build asks the compiler its version first: fails at once


def fallback_in_a_fresh_process(env: dict) -> str:
    done = subprocess.run([sys.executable, "-c", "from kernels.backend import select_kernels; "
                           "print(repr(select_kernels('torch', 'cpu').fallback))"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return eval(done.stdout.strip().splitlines()[-1])


def test_a_failed_build_is_named_and_a_chosen_reference_is_not(tmp_path):
    import os

    base = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"), **NO_COMPILER}
    assert "/bin/false" in fallback_in_a_fresh_process(base)
    assert fallback_in_a_fresh_process({**base, cpu_extension.ENV_VAR: "reference"}) == ""


@pytest.mark.e2e
def test_a_worker_on_the_references_raises_slow_kernels_and_serves(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))  # no module built here yet
    for name, value in NO_COMPILER.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv(cpu_extension.ENV_VAR, raising=False)
    config = write_config(tmp_path / "config.toml", model={"device": "cpu"}, engine={"kernels": "torch"},
                          pools={"prefill": {"pages": 64}, "decode": {"pages": 64}})
    server = LocalServer(config)
    try:
        client = server.client()
        server.wait_workers(client)
        status = client.status()
        slow = [a for a in status["alerts"] if a["kind"] == "slow_kernels"]
        workers = {w["name"] for w in status["workers"]}
        assert {a["subject"] for a in slow} == workers, slow
        assert all("/bin/false" in a["detail"] and a["severity"] == "warning" for a in slow)
        assert all("/bin/false" in w["kernels_fallback"] for w in status["workers"])
        reply = client.generate([256, 72, 105], max_new_tokens=3)  # and it serves
        assert len(reply["token_ids"]) == 3
    finally:
        server.stop()
