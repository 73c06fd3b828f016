"""Banner: the frame every standing warning over the page map shares — a bold title, lines of
text, an optional button on the right, and its own colours.

CapacityBanner, CrossingBanner, FaultsBanner and SnapshotBanner are Banners; each decides
what its lines say and when it shows (`show_lines`: hidden when there are none).

A banner takes one line of height (its title and first line, elided) until a click expands
it to all its lines, each again one line high. So three banners at once leave the page maps
their room at 1024x700, and the maps never jump when a banner's text changes: a banner's
height depends only on how many lines it shows, never on how long they are.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QSizePolicy, QVBoxLayout

from gui.widgets.elided_label import ElidedLabel

MARGIN_V = 3  # px above and below the text
LINE_GAP = 1  # px between expanded lines
MAX_LINES = 6  # lines an expanded banner shows at most (all of them in its tooltip): the maps keep their room


class Banner(QFrame):
    def __init__(self, name: str, title: str, button: str | None = None, parent=None):
        super().__init__(parent)
        self.setObjectName(name)
        self.expanded = False
        self.title = QLabel(title)
        self.title.setTextFormat(Qt.RichText)
        self.title.setSizePolicy(QSizePolicy.Maximum, QSizePolicy.Fixed)
        self.summary = ElidedLabel()  # the first line, beside the title
        self.toggle = QLabel()  # "▸ +3" (more lines) / "▾": what a click on the banner does
        self.toggle.setTextFormat(Qt.RichText)
        self.lines = QLabel()  # the other lines, while expanded (each elided to one line)
        self.lines.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.lines.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Fixed)
        self.lines.hide()
        self.button = QPushButton(button) if button else None
        head = QHBoxLayout()
        head.setSpacing(8)
        head.addWidget(self.title)
        head.addWidget(self.summary, 1)
        head.addWidget(self.toggle)
        text = QVBoxLayout()
        text.setSpacing(LINE_GAP)
        text.addLayout(head)
        text.addWidget(self.lines)
        row = QHBoxLayout(self)
        row.setContentsMargins(10, MARGIN_V, 6, MARGIN_V)
        row.addLayout(text, 1)
        if self.button is not None:
            self.button.setStyleSheet("QPushButton { padding: 0px 10px; }")
            self.button.setFixedHeight(self.line_height() + 4)
            row.addWidget(self.button, 0, Qt.AlignTop)
        self.setSizePolicy(QSizePolicy.Preferred, QSizePolicy.Fixed)
        self.setCursor(Qt.PointingHandCursor)
        self._shown: list[str] = []
        self._display: list[str] = []  # the shown lines split at newlines: one screen line each
        self._layout_lines()

    def line_height(self) -> int:
        return max(self.fontMetrics().height(), self.title.sizeHint().height()) + LINE_GAP

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
            self._display = [part for line in lines for part in str(line).split("\n")]
            self._layout_lines()
        self.setVisible(bool(lines))

    def set_expanded(self, expanded: bool) -> None:
        """All lines (True) or the first only (False)."""
        if expanded != self.expanded:
            self.expanded = expanded
            self._layout_lines()

    def mousePressEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        if event.button() == Qt.LeftButton and len(self._display) > 1:
            self.set_expanded(not self.expanded)
            event.accept()
            return
        super().mousePressEvent(event)

    def _layout_lines(self) -> None:
        first, rest = (self._display[0], self._display[1:]) if self._display else ("", [])
        more = len(rest)
        hidden = max(0, len(rest) - (MAX_LINES - 1))
        if hidden:
            rest = rest[:MAX_LINES - 2] + [f"… {hidden + 1} more line(s): hover the banner"]
        self.summary.setText(first)
        self.summary.setToolTip("\n".join(self._display))
        expanded = self.expanded and bool(rest)
        if expanded:
            width = max(50, self.lines.width() or self.width() - 40)
            metrics = self.lines.fontMetrics()
            self.lines.setText("\n".join(metrics.elidedText(line, Qt.ElideRight, width) for line in rest))
            self.lines.setToolTip("\n".join(rest))
            self.lines.setFixedHeight(len(rest) * self.line_height())
        self.lines.setVisible(expanded)
        self.toggle.setText("" if not rest else "<small>▾</small>" if expanded else f"<small>▸ +{more}</small>")
        self.setToolTip("" if not rest else "Click to show the first line only" if expanded
                        else f"Click to show {more} more line{'s' if more != 1 else ''}")
        shown_lines = 1 + (len(rest) if expanded else 0)
        self.setFixedHeight(2 * MARGIN_V + 4 + shown_lines * self.line_height() + (LINE_GAP if expanded else 0))

    def resizeEvent(self, event) -> None:  # noqa: N802
        super().resizeEvent(event)
        if self.expanded:
            self._layout_lines()  # elide the expanded lines to the new width
