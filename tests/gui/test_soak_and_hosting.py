"""200,000 telemetry messages through the real transport thread and window (the PySide6
6.12 bug killed the interpreter after ~20,000 signal emits), and the hosted mode: the
window starts `serve` itself and stops it on close."""

from __future__ import annotations

import subprocess
import sys
import time

import zmq
from PySide6.QtWidgets import QApplication

from engine.config import REPO_ROOT
from tests.gui.waits import connected_and_ready

SOAK_MESSAGES = 200_000


def _record(server, client, n: int = 600) -> list[list[bytes]]:
    """Real telemetry of a real engine under load, as raw frames."""
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.connect(server.telemetry)
    time.sleep(0.5)
    client.keyframe()
    streams = [client.submit([256, *range(i, i + 40)], max_new_tokens=60, ignore_eos=True, stream=False)
               for i in range(12)]
    frames = []
    deadline = time.monotonic() + 60
    while len(frames) < n and time.monotonic() < deadline:
        if sub.poll(200):
            frames.append(sub.recv_multipart())
    for stream in streams:
        for msg in client.events(stream):
            if msg.op in ("done", "error"):
                break
    sub.close(linger=0)
    return frames


def test_two_hundred_thousand_messages_through_the_gui(start_server, open_window, qtbot):
    server = start_server()
    client = server.client()
    recorded = _record(server, client)
    topics = {f[0].split(b"/")[0] for f in recorded}
    assert {b"pages", b"requests", b"metrics"} <= topics
    ctx = zmq.Context.instance()
    replay = ctx.socket(zmq.PUB)
    replay.setsockopt(zmq.SNDHWM, 0)
    replay.setsockopt(zmq.LINGER, 0)
    port = replay.bind_to_random_port("tcp://127.0.0.1")
    window = open_window(server.control, telemetry_endpoint=f"tcp://127.0.0.1:{port}")
    start = window.state.messages
    sent = 0
    deadline = time.monotonic() + 600
    while window.state.messages - start < SOAK_MESSAGES and time.monotonic() < deadline:
        for _ in range(500):
            replay.send_multipart(recorded[sent % len(recorded)])
            sent += 1
        # let the GUI keep up (the subscriber's queue is bounded and drops beyond it)
        target = window.state.messages + 400
        qtbot.waitUntil(lambda: window.state.messages >= min(target, start + SOAK_MESSAGES), timeout=30_000)
    replay.close()
    assert window.state.messages - start >= SOAK_MESSAGES
    window.refresh()
    assert not window.grab().isNull() and window.source.transport.isRunning()
    assert client.ping()  # and the engine was never disturbed


def test_hosted_engine_starts_with_the_window_and_stops_with_it(qtbot, tmp_path):
    from gui.app import App
    from main import parse

    app = App(parse(["gui", "--theme", "dark"]))
    qtbot.addWidget(app.window)
    app.start()
    app.window.show()
    qtbot.waitUntil(lambda: connected_and_ready(app.window), timeout=180_000)
    assert app.window.source.now.hosted and app.hosted.control == app.window.source.now.label
    pids = [app.hosted.pid, *[w.pid for w in app.window.state.workers]]
    app.window.close()
    app.stop_hosted()
    QApplication.processEvents()
    alive = subprocess.run(["ps", "-o", "pid=", "-p", ",".join(map(str, pids))], capture_output=True, text=True)
    assert alive.stdout.strip() == "", f"still running: {alive.stdout}"


def test_screenshot_flag_writes_a_png(tmp_path):
    shot = tmp_path / "shot.png"
    proc = subprocess.run([sys.executable, "main.py", "gui", "--quit-after", "12", "--screenshot", str(shot)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=240,
                          env={**__import__("os").environ, "QT_QPA_PLATFORM": "offscreen"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000


def test_a_readonly_window_hosts_its_engine_with_the_viewer_role(qtbot, monkeypatch):
    """Issue 14, item 8: --readonly is a role the server enforces, not a promise of the window."""
    from gui.app import App
    from gui.hosting import HostedEngine
    from main import parse

    monkeypatch.setattr(HostedEngine, "start", lambda self: None)
    app = App(parse(["gui", "--readonly", "--theme", "dark"]))
    qtbot.addWidget(app.window)
    app.host(None)
    extra = app.hosted.extra_args
    assert extra[extra.index("--local-role") + 1] == "viewer"
    writable = App(parse(["gui", "--theme", "dark"]))
    qtbot.addWidget(writable.window)
    writable.host(None)
    assert "--local-role" not in writable.hosted.extra_args
