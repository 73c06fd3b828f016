"""HostedEngine: `python main.py serve` as a child of the GUI, on a free loopback port.

The same code path as attaching: once the child prints its endpoints, the window
attaches to them like to any remote engine. Closing the window stops it cleanly
(SIGTERM: the supervisor stops its workers), killing it only if it does not exit in time.
A GUI that dies without closing (kill -9, a crash) takes it along too: the child asks the
kernel for SIGTERM when its parent exits (engine/parent_watch.py, Linux).
"""

from __future__ import annotations

import json
import os

from PySide6.QtCore import QObject, QProcess, QProcessEnvironment, Signal

from engine.client.local_server import REPO_ROOT, serve_command
from engine.parent_watch import PARENT_ENV

STOP_TIMEOUT_MS = 15_000


class HostedEngine(QObject):
    ready = Signal(str, str)  # control endpoint, telemetry endpoint
    failed = Signal(str)  # why it did not start or why it ended

    def __init__(self, config: str | None = None, extra_args: list[str] | None = None, parent=None):
        super().__init__(parent)
        self.config = config
        self.extra_args = extra_args or []
        self.proc = QProcess(self)
        self.proc.setWorkingDirectory(str(REPO_ROOT))
        env = QProcessEnvironment.systemEnvironment()
        env.insert(PARENT_ENV, str(os.getpid()))  # serve dies with this process, however it ends
        self.proc.setProcessEnvironment(env)
        self.proc.setProcessChannelMode(QProcess.ProcessChannelMode.SeparateChannels)
        self.proc.readyReadStandardOutput.connect(self._read_stdout)
        self.proc.finished.connect(self._finished)
        self.control: str | None = None
        self._stderr_tail = ""
        self._stopping = False
        self.proc.readyReadStandardError.connect(self._read_stderr)

    def start(self) -> None:
        program, *args = serve_command(*self.extra_args, *(["--config", self.config] if self.config else []))
        self.proc.start(program, args)

    @property
    def pid(self) -> int | None:
        pid = self.proc.processId()
        return int(pid) if pid else None

    def stop(self) -> None:
        """Ask the supervisor to shut down; kill it if it does not within STOP_TIMEOUT_MS."""
        if self.proc.state() == QProcess.ProcessState.NotRunning:
            return
        self._stopping = True
        self.proc.terminate()
        if not self.proc.waitForFinished(STOP_TIMEOUT_MS):
            self.proc.kill()
            self.proc.waitForFinished(5000)

    def _read_stdout(self) -> None:
        while self.proc.canReadLine():
            line = bytes(self.proc.readLine()).decode(errors="replace").strip()
            try:
                ready = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(ready, dict) and ready.get("ready"):
                self.control = ready["control"]
                self.ready.emit(ready["control"], ready["telemetry"])

    def _read_stderr(self) -> None:
        text = bytes(self.proc.readAllStandardError()).decode(errors="replace")
        self._stderr_tail = (self._stderr_tail + text)[-4000:]

    def _finished(self, code: int, status) -> None:
        if not self._stopping:
            tail = self._stderr_tail.strip().splitlines()[-3:]
            self.failed.emit(f"the hosted engine exited with code {code}: {' / '.join(tail) or 'no output'}")
