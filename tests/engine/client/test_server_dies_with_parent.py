"""A server started by LocalServer ends when the Python that started it dies without stopping
it (an interrupted bench or test must not leave an engine and its workers holding cores)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from engine.config import REPO_ROOT

pytestmark = pytest.mark.e2e  # real engine processes

PARENT = """
import sys, time
from pathlib import Path

from engine.client.local_server import LocalServer, write_config
server = LocalServer(write_config(Path(sys.argv[1]) / "config.toml"))
print(server.proc.pid, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie nobody reaps is gone for our purpose
        return f.read().split(")")[-1].split()[0] != "Z"


def test_the_server_and_its_workers_end_with_their_parent(tmp_path):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path)], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                              text=True)
    server_pid = int(parent.stdout.readline())
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not _children(server_pid):
        time.sleep(0.2)  # the workers are spawned once the server listens
    workers = _children(server_pid)
    assert workers, "the server started no workers"
    parent.send_signal(signal.SIGKILL)  # no finally, no stop(): the parent just vanishes
    parent.wait()
    parent.stdout.close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(_alive(p) for p in [server_pid, *workers]):
        time.sleep(0.2)
    assert not any(_alive(p) for p in [server_pid, *workers]), "the server or a worker outlived its parent"


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except FileNotFoundError:
        return []
