"""MessageArea: the status bar's place for short messages ("Snapshot written to …", "stop
failed: …") that nothing covers.

QStatusBar draws a temporary message only in the room its widgets leave, and the status line
(a permanent widget with stretch) left none, so every message was invisible. This label is a
widget of its own, left of the status line, with the stretch; it shows the newest message
until its time is up, and its tooltip lists the last few with the time each came.
"""

from __future__ import annotations

import time

from PySide6.QtCore import QTimer

from gui import theme
from gui.widgets.elided_label import ElidedLabel

KEEP = 10  # messages listed in the tooltip
TONES = ("info", "ok", "warning", "danger")


class MessageArea(ElidedLabel):
    def __init__(self, parent=None):
        super().__init__("", parent)
        self.setObjectName("messageArea")
        self.history: list[tuple[float, str]] = []  # (wall time, text), newest last
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.timeout.connect(self.clear_message)

    def show_message(self, text: str, timeout_ms: int = 10_000, tone: str = "info") -> None:
        """Show `text` for `timeout_ms` (0: until the next message); tone is one of TONES."""
        if not text:
            return
        self.history = [*self.history, (time.time(), text)][-KEEP:]
        self.setText(text)
        colour = "" if tone == "info" else f"color: {theme.color(tone).name()};"
        self.setStyleSheet(f"QLabel#messageArea {{ {colour} font-weight: bold; }}")
        self.setToolTip("\n".join(f"{time.strftime('%H:%M:%S', time.localtime(t))}  {m}"
                                  for t, m in reversed(self.history)))
        self._timer.stop()
        if timeout_ms > 0:
            self._timer.start(timeout_ms)

    def message(self) -> str:
        """The message shown now ("" when none)."""
        return self.full_text()

    def clear_message(self) -> None:
        tooltip = self.toolTip()
        self.setText("")
        self.setToolTip(tooltip)  # the last messages stay readable
