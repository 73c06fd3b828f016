"""Issue 15, item 9: a GUI that hosts an engine leaves no engine behind, however it ends.

The real `main.py gui` in a subprocess hosts `serve` and its workers; the test finds them
in /proc, ends the GUI with a signal, and checks every one of them is gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.client.local_server import write_config
from engine.config import REPO_ROOT
from engine.parent_watch import PARENT_ENV
from tests.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")]

STARTUP_S = 180.0
GUI_EXIT_S = 30.0  # the window closes and waits for serve to stop its workers
ORPHANS_GONE_S = 30.0


def children(pid: int) -> list[int]:
    """Direct children of `pid` (every thread's), from /proc."""
    kids = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids += [int(k) for k in (task / "children").read_text().split()]
        except OSError:
            pass
    return kids


def descendants(pid: int) -> list[int]:
    found, todo = [], children(pid)
    while todo:
        kid = todo.pop()
        found.append(kid)
        todo += children(kid)
    return found


def alive(pid: int) -> bool:
    """Running (a zombie nobody has reaped yet counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.fixture
def hosted_gui(tmp_path):
    """(gui Popen, serve pid, worker pids): `main.py gui` hosting an engine of two small pools."""
    config = write_config(tmp_path / "config.toml", pools={"prefill": {"pages": 64}, "decode": {"pages": 64}})
    log = open(tmp_path / "gui.log", "wb")
    gui = subprocess.Popen([sys.executable, "main.py", "gui", "--theme", "dark", "--config", str(config)],
                           cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                           env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})
    started: list[int] = []
    try:
        def up():
            serve = [p for p in children(gui.pid) if " serve " in cmdline(p)]
            workers = descendants(serve[0]) if serve else []
            return (serve[0], workers) if len(workers) >= 2 else None

        serve, workers = wait_for(up, STARTUP_S, "the hosted serve and its two workers")
        started += [serve, *workers]
        time.sleep(1.0)  # let the window attach: the GUI is in its event loop, not starting up
        yield gui, serve, workers
    finally:
        if gui.poll() is None:
            gui.kill()
            gui.wait()
        for pid in started:  # never leave an engine behind, even when the test fails
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        log.close()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_quit_signal_stops_the_hosted_engine_like_ctrl_q(hosted_gui, signum):
    gui, serve, workers = hosted_gui
    gui.send_signal(signum)
    code = gui.wait(timeout=GUI_EXIT_S)
    assert code == 0, f"the GUI ended with {code} on {signal.Signals(signum).name}"
    # the GUI waited for serve, and serve for its workers: nothing is left at all
    left = [p for p in (serve, *workers) if alive(p)]
    assert not left, f"still running after {signal.Signals(signum).name}: {[cmdline(p) for p in left]}"


def test_a_killed_gui_takes_its_engine_along(hosted_gui):
    gui, serve, workers = hosted_gui
    # serve asked for SIGTERM on its parent's death (without it, serve lingered ~12 s here and
    # its workers until their orphan timeout: the outcome alone would not tell the two apart)
    environ = Path(f"/proc/{serve}/environ").read_bytes().split(b"\0")
    assert f"{PARENT_ENV}={gui.pid}".encode() in environ
    gui.kill()  # SIGKILL: no handler runs in the GUI
    gui.wait(timeout=GUI_EXIT_S)
    wait_for(lambda: not any(alive(p) for p in (serve, *workers)), ORPHANS_GONE_S,
             f"serve {serve} and workers {workers} to stop after the GUI was killed")
