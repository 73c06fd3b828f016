"""AlertsTabBadge: the Alerts tab's title says how many firing alerts nobody acknowledged, and
carries a warning sign while a pair of requests whose data crossed is unacknowledged; red
while either holds."""

from __future__ import annotations

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QTabWidget

from gui import theme
from gui.model.engine_state import EngineState
from gui.widgets.state_view import StateView


def badge_text(unacked_firing: int, crossed: int) -> str:
    text = "Alerts"
    if unacked_firing:
        text += f" ({unacked_firing})"
    if crossed:
        text += " \u26a0"
    return text


class AlertsTabBadge(StateView, QObject):
    def __init__(self, state: EngineState, tabs: QTabWidget, index: int):
        super().__init__(tabs)
        self.tabs, self.index = tabs, index
        self._default = tabs.tabBar().tabTextColor(index)
        self.state = state
        self.refresh()

    def follows(self) -> dict:
        return {"alerts": self.refresh, "crossings": self.refresh}

    def refresh(self) -> None:
        firing = sum(1 for a in self.state.alerts.values() if a.live_firing and not a.acked)
        crossed = self.state.crossings.unacknowledged
        self.tabs.setTabText(self.index, badge_text(firing, crossed))
        self.tabs.tabBar().setTabTextColor(self.index, theme.color("danger") if firing or crossed
                                           else self._default)
