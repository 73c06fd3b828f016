"""Notifier: a desktop notification (system tray) for each new pair of requests whose data
crossed and for each alert kind that starts firing for the first time.

Toasts vanish after seconds and a firing alert only grows its count, so an operator looking
at another window could miss a second leak; this reaches them outside the window. Without a
system tray (a headless session) the messages are still kept in `sent` and the in-window
banner shows. Every message goes to `sent`; the tray pops at most one per second, and the
next one it pops says how many it held back.
"""

from __future__ import annotations

import time

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QApplication, QSystemTrayIcon

from engine.wire.alert_kinds import ISOLATION_KINDS
from engine.wire.states import AlertState
from gui.model.engine_state import EngineState
from gui.widgets.state_view import StateView

MIN_INTERVAL_S = 1.0
KEEP = 200


class Notifier(StateView, QObject):
    def __init__(self, state: EngineState, parent: QObject | None = None):
        super().__init__(parent)
        self.sent: list[tuple[str, str]] = []  # (title, text), newest last
        self._kinds_seen: set[str] = set()
        self._last_at = 0.0
        self._folded = 0
        self.tray: QSystemTrayIcon | None = None
        if QSystemTrayIcon.isSystemTrayAvailable():
            self.tray = QSystemTrayIcon(QApplication.windowIcon(), self)
            self.tray.setToolTip("PageWarden")
            self.tray.show()
        self.state = state

    def follows(self) -> dict:
        return {"crossings": self.on_crossings, "alerts": self.on_alerts}

    def state_replaced(self) -> None:
        self._kinds_seen = {a.kind for a in self.state.alerts.values() if a.state == AlertState.FIRING}

    def on_crossings(self) -> None:
        new = self.state.take_new_crossings()
        if len(new) == 1:
            self.notify("Data crossed between requests", new[0].sentence())
        elif new:
            self.notify("Data crossed between requests",
                        f"{len(new)} new pairs, e.g. {new[-1].sentence()}")

    def on_alerts(self) -> None:
        for alert in list(self.state.alerts.values()):
            if not alert.live_firing or alert.kind in self._kinds_seen:
                continue
            self._kinds_seen.add(alert.kind)
            if alert.kind in ISOLATION_KINDS or alert.severity == "critical":
                self.notify(f"{alert.severity.upper()}: {alert.kind}", alert.detail.splitlines()[0][:200]
                            if alert.detail else alert.kind)

    def notify(self, title: str, text: str) -> None:
        self.sent.append((title, text))
        del self.sent[:-KEEP]
        now = time.monotonic()
        if now - self._last_at < MIN_INTERVAL_S:
            self._folded += 1  # held back: the next popup says so
            return
        if self._folded:
            text, self._folded = f"{text} (and {self._folded} more notification(s))", 0
        self._last_at = now
        if self.tray is not None:
            self.tray.showMessage(title, text, QSystemTrayIcon.MessageIcon.Critical, 10_000)
