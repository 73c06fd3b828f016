"""CapacityBanner: the standing I6 warning — the context window is larger than a pool holds.

Visible exactly while the engine's capacity findings contain an exceeding one; it never
hides on its own or on a click, only when a later capacity message says the window fits.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QSizePolicy, QVBoxLayout

from gui import theme
from gui.model.engine_state import EngineState
from gui.widgets.state_view import StateView


def describe_limit(limit: str) -> str:
    """"pool:prefill" -> "the prefill pool"; "model:..." -> "the model's trained positions"."""
    kind, _, name = str(limit).partition(":")
    if kind == "pool":
        return f"the {name} pool"
    if kind == "model":
        return "the model's trained positions"
    return str(limit)


def finding_line(finding: dict) -> str:
    """One sentence with both numbers and the requests that cannot be served."""
    window, limit = finding.get("window_tokens"), finding.get("limit_tokens")
    if not isinstance(window, int) or not isinstance(limit, int):
        return str(finding.get("message") or finding)  # an engine we do not know: show its words
    shortfall = finding.get("shortfall_tokens", window - limit)
    return (f"Context window {window:,} tokens exceeds {describe_limit(finding.get('limit', '?'))} "
            f"({limit:,} tokens) by {shortfall:,} tokens — requests longer than {limit:,} tokens "
            f"cannot be served")


class CapacityBanner(StateView, QFrame):
    """Red banner over the window while state.exceeding_findings() is non-empty."""

    reconfigure_requested = Signal()

    def __init__(self, state: EngineState, parent=None):
        super().__init__(parent)
        self.state = state
        self._readonly = False
        self._shown_lines: list[str] = []
        self.setObjectName("capacityBanner")
        self.title = QLabel("<b>Capacity warning (I6)</b>")
        self.lines = QLabel()
        self.lines.setWordWrap(True)
        self.lines.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.reconfigure_button = QPushButton("Reconfigure…")
        self.reconfigure_button.setToolTip("Change the context window or the pool sizes")
        self.reconfigure_button.clicked.connect(self.reconfigure_requested)
        text = QVBoxLayout()
        text.setSpacing(2)
        text.addWidget(self.title)
        text.addWidget(self.lines)
        text.addStretch(1)
        row = QHBoxLayout(self)
        row.setContentsMargins(10, 6, 10, 6)
        row.addLayout(text, 1)
        row.addWidget(self.reconfigure_button, 0, Qt.AlignVCenter)
        self.setSizePolicy(QSizePolicy.Preferred, QSizePolicy.Maximum)
        bg, fg = theme.color("danger_bg").name(), theme.color("danger_fg").name()
        self.setStyleSheet(f"QFrame#capacityBanner {{ background: {bg}; border-radius: 4px; }}"
                           f"QFrame#capacityBanner QLabel {{ color: {fg}; }}")
        self.refresh()

    def follows(self) -> dict:
        return {"capacity": self.refresh, "engine": self.refresh}

    def refresh(self) -> None:
        """Re-read the findings; show one line per exceeding finding, or hide."""
        lines = [finding_line(f) for f in self.state.exceeding_findings()]
        if lines != self._shown_lines:
            self._shown_lines = lines
            self.lines.setText("\n".join(lines))
        self.setVisible(bool(lines))
        self.reconfigure_button.setEnabled(not self._readonly)

    def shown_lines(self) -> list[str]:
        return list(self._shown_lines)

    def set_readonly(self, readonly: bool) -> None:
        self._readonly = bool(readonly)
        self.refresh()
