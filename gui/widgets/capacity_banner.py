"""CapacityBanner: the standing I6 warning — the context window is larger than a pool holds.

Visible exactly while the engine's capacity findings contain an exceeding one; it never
hides on its own or on a click, only when a later capacity message says the window fits.
"""

from __future__ import annotations

from PySide6.QtCore import Signal

from gui import theme
from gui.model.engine_state import EngineState
from gui.widgets.banner import Banner
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


class CapacityBanner(StateView, Banner):
    """Red banner over the window while state.exceeding_findings() is non-empty."""

    reconfigure_requested = Signal()

    def __init__(self, state: EngineState, parent=None):
        super().__init__("capacityBanner", "<b>Capacity warning (I6)</b>", "Reconfigure…", parent)
        self.state = state
        self._readonly = False
        self.reconfigure_button = self.button
        self.reconfigure_button.setToolTip("Change the context window or the pool sizes")
        self.reconfigure_button.clicked.connect(self.reconfigure_requested)
        self.set_colors(theme.color("danger_bg").name(), theme.color("danger_fg").name())
        self.refresh()

    def follows(self) -> dict:
        return {"capacity": self.refresh, "engine": self.refresh}

    def refresh(self) -> None:
        """Re-read the findings; show one line per exceeding finding, or hide."""
        self.show_lines([finding_line(f) for f in self.state.exceeding_findings()])
        self.reconfigure_button.setEnabled(not self._readonly)

    def set_readonly(self, readonly: bool) -> None:
        self._readonly = bool(readonly)
        self.refresh()
