"""FaultsBanner: the standing warning that this engine runs with isolation defences off or
faults injected (an `--allow-faults` engine reproducing an incident).

It names every defence that is off and every fault that is on, from the engine's config
(status), and hides only when all defences are on and no fault is (issue 15, item 3: before,
an attached window showed nothing of it).
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QLabel, QSizePolicy, QVBoxLayout

from engine.wire.defences import DEFENCES, FAULTS
from gui import theme
from gui.model.engine_state import EngineState
from gui.widgets.state_view import StateView


def weakened(config: dict) -> tuple[list[str], list[str]]:
    """(labels of the defences that are off, labels of the faults that are on)."""
    defences, faults = config.get("defences") or {}, config.get("faults") or {}
    off = [d.label for d in DEFENCES if defences.get(d.name) is False]
    on = [f.label for f in FAULTS if faults.get(f.name) is True]
    return off, on


class FaultsBanner(StateView, QFrame):
    def __init__(self, state: EngineState, parent=None):
        super().__init__(parent)
        self.setObjectName("faultsBanner")
        self.title = QLabel("<b>Isolation weakened on purpose: this engine runs with --allow-faults</b>")
        self.lines = QLabel()
        self.lines.setWordWrap(True)
        self.lines.setTextInteractionFlags(Qt.TextSelectableByMouse)
        box = QVBoxLayout(self)
        box.setContentsMargins(10, 4, 10, 4)
        box.setSpacing(2)
        box.addWidget(self.title)
        box.addWidget(self.lines)
        self.setSizePolicy(QSizePolicy.Preferred, QSizePolicy.Maximum)
        warn = theme.color("warning").name()
        self.setStyleSheet(f"QFrame#faultsBanner {{ border: 2px solid {warn}; border-radius: 4px; }}"
                           f"QFrame#faultsBanner QLabel {{ color: {warn}; }}")
        self._shown: list[str] = []
        self.state = state
        self.refresh()

    def follows(self) -> dict:
        return {"engine": self.refresh}

    def shown_lines(self) -> list[str]:
        return list(self._shown)

    def refresh(self) -> None:
        off, on = weakened(self.state.config or {})
        lines = []
        if off:
            lines.append("Defences OFF: " + "; ".join(off))
        if on:
            lines.append("Faults ON: " + "; ".join(on))
        if lines != self._shown:
            self._shown = lines
            self.lines.setText("\n".join(lines))
        self.setVisible(bool(lines))
