"""KvEventThread: the one thread that owns a KV-event watcher's sockets.

It waits on the watcher (poll with a timeout: never a NOBLOCK loop) and lets it apply what
arrives, replays included, to a SharedKvEventState; the GUI thread reads that state under
its lock at its 10 Hz refresh. The watcher is made on the GUI thread (so that a bad
address fails the attach at once) and handed over before the thread starts; from then on
only this thread touches its sockets, and it closes them.
"""

from __future__ import annotations

import zmq
from PySide6.QtCore import QThread, Signal

from engine.adapters.kv_event_watch import KvEventWatcher

POLL_MS = 50


class KvEventThread(QThread):
    failed = Signal(str)  # a socket error (the thread keeps watching)

    def __init__(self, watcher: KvEventWatcher, parent=None):
        super().__init__(parent)
        self.watcher = watcher
        self._running = True

    def stop(self) -> None:
        """End the thread (after the poll or replay in hand) and close the watcher."""
        self._running = False
        if self.isRunning():
            self.wait(10_000)
        else:
            self.watcher.close()  # never started: its sockets are still the caller's

    def run(self) -> None:
        try:
            while self._running:
                try:
                    self.watcher.poll(POLL_MS)
                except zmq.ZMQError as exc:  # a socket error must not end the session
                    self.failed.emit(f"KV events: {exc}")
                    self.msleep(POLL_MS)  # the same error again at once would flood the GUI
        finally:
            self.watcher.close()
