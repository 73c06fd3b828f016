"""Banner: the frame every standing warning over the page map shares — a bold title, lines of
selectable text, an optional button on the right, and its own colours.

CapacityBanner, CrossingBanner, FaultsBanner and SnapshotBanner are Banners; each decides
what its lines say and when it shows (`show_lines`: hidden when there are none).
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QSizePolicy, QVBoxLayout


class Banner(QFrame):
    def __init__(self, name: str, title: str, button: str | None = None, parent=None):
        super().__init__(parent)
        self.setObjectName(name)
        self.title = QLabel(title)
        self.title.setTextFormat(Qt.RichText)
        self.lines = QLabel()
        self.lines.setWordWrap(True)
        self.lines.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.button = QPushButton(button) if button else None
        text = QVBoxLayout()
        text.setSpacing(2)
        text.addWidget(self.title)
        text.addWidget(self.lines)
        row = QHBoxLayout(self)
        row.setContentsMargins(10, 6, 10, 6)
        row.addLayout(text, 1)
        if self.button is not None:
            row.addWidget(self.button, 0, Qt.AlignVCenter)
        self.setSizePolicy(QSizePolicy.Preferred, QSizePolicy.Maximum)
        self._shown: list[str] = []

    def set_colors(self, background: str | None, foreground: str, border: str | None = None) -> None:
        name = self.objectName()
        frame = (f"background: {background};" if background else "") + \
            (f" border: 2px solid {border};" if border else "")
        self.setStyleSheet(f"QFrame#{name} {{ {frame} border-radius: 4px; }}"
                           f"QFrame#{name} QLabel {{ color: {foreground}; }}")

    def shown_lines(self) -> list[str]:
        return list(self._shown)

    def show_lines(self, lines: list[str]) -> None:
        """Show these lines (hidden when there are none); repaints only on a change."""
        if lines != self._shown:
            self._shown = list(lines)
            self.lines.setText("\n".join(lines))
        self.setVisible(bool(lines))
