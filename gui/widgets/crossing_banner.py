"""CrossingBanner: the standing "data crossed" warning.

Shown while the engine has counted a (source, reader) pair of requests whose data crossed
that the operator has not acknowledged: how many, between which tenants, the newest pairs
and the time of the last new one. Acknowledge hides it until the next new pair; it never
hides on its own. (A firing alert only grows its count when a second leak happens; this is
what makes the second leak visible.)
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QSizePolicy, QVBoxLayout

from gui import theme
from gui.model.engine_state import EngineState
from gui.widgets.state_view import StateView


class CrossingBanner(StateView, QFrame):
    acknowledged = Signal()

    def __init__(self, state: EngineState, parent=None):
        super().__init__(parent)
        self.state = state
        self._shown: list[str] = []
        self.setObjectName("crossingBanner")
        self.title = QLabel("<b>Data crossed between requests</b>")
        self.lines = QLabel()
        self.lines.setWordWrap(True)
        self.lines.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.ack_button = QPushButton("Acknowledge")
        self.ack_button.setToolTip("Hide until the next new pair of requests")
        self.ack_button.clicked.connect(self.acknowledge)
        text = QVBoxLayout()
        text.setSpacing(2)
        text.addWidget(self.title)
        text.addWidget(self.lines)
        row = QHBoxLayout(self)
        row.setContentsMargins(10, 6, 10, 6)
        row.addLayout(text, 1)
        row.addWidget(self.ack_button, 0, Qt.AlignVCenter)
        self.setSizePolicy(QSizePolicy.Preferred, QSizePolicy.Maximum)
        bg, fg = theme.color("danger_bg").name(), theme.color("danger_fg").name()
        self.setStyleSheet(f"QFrame#crossingBanner {{ background: {bg}; border-radius: 4px; }}"
                           f"QFrame#crossingBanner QLabel {{ color: {fg}; }}")
        self.refresh()

    def follows(self) -> dict:
        return {"crossings": self.refresh}

    def shown_lines(self) -> list[str]:
        return list(self._shown)

    def acknowledge(self) -> None:
        self.state.crossings.acknowledge()
        self.state.events.crossings.mark()
        self.refresh()
        self.acknowledged.emit()

    def refresh(self) -> None:
        lines = self.state.crossings.lines()
        if lines != self._shown:
            self._shown = lines
            self.lines.setText("\n".join(lines))
        self.setVisible(bool(lines))
