"""CrossingBanner: the standing "data crossed" warning.

Shown while the engine has counted a (source, reader) pair of requests whose data crossed
that the operator has not acknowledged: how many, between which tenants, the newest pairs
and the time of the last new one. Acknowledge hides it until the next new pair; it never
hides on its own. (A firing alert only grows its count when a second leak happens; this is
what makes the second leak visible.)
"""

from __future__ import annotations

from PySide6.QtCore import Signal

from gui import theme
from gui.model.engine_state import EngineState
from gui.widgets.banner import Banner
from gui.widgets.state_view import StateView


class CrossingBanner(StateView, Banner):
    acknowledged = Signal()

    def __init__(self, state: EngineState, parent=None):
        super().__init__("crossingBanner", "<b>Data crossed</b>", "Acknowledge", parent)
        self.ack_button = self.button
        self.ack_button.setToolTip("Hide until the next new pair of requests")
        self.ack_button.clicked.connect(self.acknowledge)
        self.set_colors(theme.color("danger_bg").name(), theme.color("danger_fg").name())
        self.state = state
        self.refresh()

    def follows(self) -> dict:
        return {"crossings": self.refresh}

    def acknowledge(self) -> None:
        self.state.crossings.acknowledge()
        self.state.events.crossings.mark()
        self.refresh()
        self.acknowledged.emit()

    def refresh(self) -> None:
        self.show_lines(self.state.crossings.lines())
