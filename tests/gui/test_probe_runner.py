"""The window's probe runs go to one ProbeRunner thread, one run at a time (issue 13, part 4)."""

from __future__ import annotations

import threading
import time

from gui import probe_view
from gui.probe_view import ProbeRelay, ProbeRunner


def test_runs_go_one_at_a_time_to_one_thread(qtbot, monkeypatch):
    seen, running = [], []

    def fake_run(schedule, stop, relay):
        running.append(schedule)
        assert len(running) == 1, "two runs at once"
        seen.append((schedule, threading.current_thread().ident))
        time.sleep(0.05)
        running.remove(schedule)
        relay.run_ended.emit(schedule)

    monkeypatch.setattr(probe_view, "run_probe", fake_run)
    relay = ProbeRelay()
    ended = []
    relay.run_ended.connect(ended.append)
    runner = ProbeRunner(relay)
    stop = threading.Event()
    for name in ("first", "second", "third"):
        runner.submit(name, stop)
    qtbot.waitUntil(lambda: len(ended) == 3, timeout=5000)
    assert [s for s, _ in seen] == ["first", "second", "third"] == ended  # in order, on the GUI thread's side too
    assert len({ident for _, ident in seen}) == 1  # one thread for all of them
    assert sum(t.name == "leak-probe" for t in threading.enumerate()) == 1
    runner.close()
    assert not runner.alive
    runner.submit("after close", stop)  # a closed runner starts a new thread when asked again
    qtbot.waitUntil(lambda: len(ended) == 4, timeout=5000)
    runner.close()
