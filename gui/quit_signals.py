"""QuitSignals: SIGTERM, SIGINT and SIGHUP end the app the way File -> Quit does.

Python runs a signal handler only when the interpreter gets control, and inside
QApplication.exec() it may not for as long as no Python slot runs, so `kill -TERM` used to
end the GUI without stopping the engine it hosts. Here the C-level handler writes the
signal number to a socket (signal.set_wakeup_fd); a QSocketNotifier on the other end
wakes the event loop, which emits `received(signum)` in the GUI thread.
"""

from __future__ import annotations

import signal
import socket

from PySide6.QtCore import QObject, QSocketNotifier, Signal

QUIT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class QuitSignals(QObject):
    """While installed, each of QUIT_SIGNALS emits `received(signum)` from the event loop.
    Install from the main thread (signal.set_wakeup_fd raises ValueError elsewhere)."""

    received = Signal(int)

    def __init__(self, parent=None):
        super().__init__(parent)
        self._reader, self._writer = socket.socketpair()
        for end in (self._reader, self._writer):
            end.setblocking(False)  # the wakeup fd must never block the C handler
        self._previous_fd: int | None = None
        self._previous_handlers: dict[int, object] = {}
        self._notifier = QSocketNotifier(self._reader.fileno(), QSocketNotifier.Type.Read, self)
        self._notifier.activated.connect(self._drain)

    def install(self) -> "QuitSignals":
        self._previous_fd = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        for signum in QUIT_SIGNALS:
            # the Python handler does nothing: the byte on the wakeup fd carries the signal
            self._previous_handlers[signum] = signal.signal(signum, lambda *_: None)
        return self

    def uninstall(self) -> None:
        """Put back the handlers and wakeup fd found at install()."""
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers.clear()
        if self._previous_fd is not None:
            signal.set_wakeup_fd(self._previous_fd)
            self._previous_fd = None
        self._notifier.setEnabled(False)
        self._reader.close()
        self._writer.close()

    def _drain(self, *_) -> None:
        try:
            data = self._reader.recv(512)
        except (BlockingIOError, InterruptedError):
            return
        for signum in dict.fromkeys(data):  # once per signal, in order of arrival
            if signum in QUIT_SIGNALS:
                self.received.emit(signum)
