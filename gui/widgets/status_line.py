"""StatusLine: engine address and name, connection state, telemetry age and a STALE flag for the status bar.

Stale means no telemetry for a while: what the window shows may no longer be true, so the
window greys the live views (each its own way) while `stale_changed(True)` holds.
"""

from __future__ import annotations

import time

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QWidget

from gui import theme
from gui.model.engine_state import EngineState
from gui.widgets.state_view import StateView

STALE_OPACITY = 0.35


def age_text(age: float | None) -> str:
    """Seconds since the last telemetry message, as the status bar says it."""
    if age is None:
        return "no telemetry yet"
    if age < 60:
        return f"telemetry {age:.1f} s ago"
    if age < 3600:
        return f"telemetry {age / 60:.0f} min ago"
    return f"telemetry {age / 3600:.1f} h ago"


STALE_TOOLTIP = "No telemetry for a while: this view may be out of date."


class StatusLine(StateView, QWidget):
    """Call set_address/set_connection when they change and refresh() on the window's timer."""

    stale_changed = Signal(bool)

    def __init__(self, state: EngineState, parent=None):
        super().__init__(parent)
        self.state = state
        self._stale: bool | None = None
        self._connection = "disconnected"
        self.address_label = QLabel("no engine")
        self.name_label = QLabel()  # the engine's `name` from its status (e.g. "vLLM 0.32.0 (PageWarden agent)")
        self.name_label.hide()
        self.connection_label = QLabel()
        self.age_label = QLabel()
        self.stale_label = QLabel("STALE")
        self.stale_label.setToolTip("No telemetry for a while: what the window shows may be out of date.")
        self.readonly_label = QLabel("read-only")
        self.readonly_label.hide()
        layout = QHBoxLayout(self)
        layout.setContentsMargins(4, 0, 4, 0)
        layout.setSpacing(12)
        for label in (self.address_label, self.name_label, self.connection_label, self.age_label, self.readonly_label,
                      self.stale_label):
            layout.addWidget(label)
        layout.addStretch(1)
        self._restyle()
        self.refresh()

    def follows(self) -> dict:
        return {"frame": self.refresh, "engine": self._show_engine}

    def _show_engine(self) -> None:
        name = self.state.engine.get("name") if isinstance(self.state.engine, dict) else None
        text = name[:120] if isinstance(name, str) else ""
        self.name_label.setText(text)
        self.name_label.setVisible(bool(text))

    @property
    def stale(self) -> bool:
        return bool(self._stale)

    def set_endpoint(self, endpoint: str, hosted: bool = False) -> None:
        """The engine's control address; hosted engines are marked as such."""
        text = endpoint or "no engine"
        self.address_label.setText(f"hosted engine {text}" if hosted and endpoint else text)

    set_address = set_endpoint

    def set_connection(self, connection: str) -> None:
        """"connected", "reconnecting", "hosted engine starting …", "disconnected" or any text."""
        self._connection = connection
        self.connection_label.setText(connection)
        tone = "ok" if connection == "connected" else "warning" if connection != "disconnected" else "danger"
        self.connection_label.setStyleSheet(f"color: {theme.color(tone).name()};")

    def set_readonly(self, readonly: bool, why: str = "") -> None:
        self.readonly_label.setVisible(bool(readonly))
        self.readonly_label.setToolTip(why)

    def set_snapshot(self, taken: str | None) -> None:
        """Showing a snapshot taken at `taken` (None: live again): no telemetry age, never stale."""
        self._snapshot = taken
        self.refresh()

    def refresh(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if getattr(self, "_snapshot", None):
            self.age_label.setText(f"snapshot taken {self._snapshot}")
            self.stale_label.setVisible(False)
            return
        self.age_label.setText(age_text(self.state.telemetry_age(now)))
        # stale: no telemetry for a while, or the engine stopped answering its control socket
        stale = self.state.is_stale(now) or self._connection != "connected"
        self.stale_label.setVisible(stale)
        if stale != self._stale:
            self._stale = stale
            self.stale_changed.emit(stale)

    def changeEvent(self, event) -> None:
        if event.type() in (event.Type.PaletteChange, event.Type.ApplicationPaletteChange):
            self._restyle()
        super().changeEvent(event)

    def _restyle(self) -> None:
        self.set_connection(self._connection)
        self.stale_label.setStyleSheet(
            f"color: {theme.color('danger_fg').name()}; background: {theme.color('danger_bg').name()};"
            " font-weight: bold; padding: 0 6px; border-radius: 3px;")
