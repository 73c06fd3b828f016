"""HistoryBar: a time slider over the page maps of the last minutes (state.history).

Its right end is Live. Dragging left (or the arrow keys, or `show_time` from an alert)
picks a recorded frame: `frame_chosen(HistoryFrame)` is emitted and the page maps show the
pages as they were, while the recording goes on; Live (or the right end) emits
`frame_chosen(None)`. A frame that the history drops while it is shown stays shown.
"""

from __future__ import annotations

import datetime as dt
import time

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QSlider, QWidget

from engine.wire.page_tags import PageState
from gui import theme
from gui.model.page_history import HistoryFrame
from gui.widgets.elided_label import ElidedLabel
from gui.widgets.state_view import StateView


def _clock(t: float) -> str:
    return dt.datetime.fromtimestamp(t).strftime("%H:%M:%S.%f")[:-5]


class HistoryBar(StateView, QWidget):
    frame_chosen = Signal(object)  # HistoryFrame, or None: live

    def __init__(self, state, parent=None):
        super().__init__(parent)
        self.frame: HistoryFrame | None = None  # None: live
        self._held = 0  # pages held in the frame shown
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setToolTip("Page maps of the last minutes: drag left to see pages as they were; "
                               "the right end is live")
        self.slider.setPageStep(10)
        self.slider.valueChanged.connect(self._on_slider)
        self.live_button = QPushButton("Live")
        self.live_button.setToolTip("Back to the live page maps")
        self.live_button.clicked.connect(self.go_live)
        self.label = ElidedLabel()
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(QLabel("History"))
        layout.addWidget(self.slider, 3)
        layout.addWidget(self.live_button)
        layout.addWidget(self.label, 2)
        self.state = state
        self._sync()

    def follows(self) -> dict:
        return {"history": self._sync, "frame": self._update_label}

    def state_replaced(self) -> None:
        self.go_live()
        self._sync()

    @property
    def live(self) -> bool:
        return self.frame is None

    # ---- choosing ---------------------------------------------------------------------
    def go_live(self) -> None:
        was = self.frame
        self.frame = None
        self.state.set_rewind(None)
        self._sync()
        if was is not None:
            self.frame_chosen.emit(None)

    def show_index(self, i: int) -> None:
        """Show recorded frame i (0 the oldest; len(history) or more: live)."""
        history = self.state.history
        if i >= len(history):
            self.go_live()
            return
        self.frame = history.frame(max(0, i))
        self._held = sum(int((p.arrays["state"] != PageState.FREE).sum()) for p in self.frame.pools.values())
        self.state.set_rewind(self.frame.time)  # the requests table goes back with the maps
        self._sync()
        self.frame_chosen.emit(self.frame)

    def show_time(self, t: float) -> bool:
        """Show the page maps as they were at wall time t (the newest frame at or before it).
        False when the history does not reach back that far (nothing changes)."""
        i = self.state.history.index_at(t)
        if i is None:
            return False
        self.show_index(i)
        return True

    def _on_slider(self, value: int) -> None:
        if self._syncing:
            return
        self.show_index(value)

    # ---- following the history ----------------------------------------------------------
    _syncing = False

    def _sync(self) -> None:
        """The slider's range is the frames kept plus Live; its handle stays on the frame shown."""
        history = self.state.history
        n = len(history)
        if self.frame is None:
            value = n
        else:
            i = history.index_at(self.frame.time)
            value = 0 if i is None else i
        self._syncing = True
        try:
            self.slider.setRange(0, n)
            self.slider.setValue(value)
        finally:
            self._syncing = False
        self.slider.setEnabled(n > 0)
        self.live_button.setEnabled(self.frame is not None)
        self._update_label()

    def _update_label(self) -> None:
        history = self.state.history
        if self.frame is None:
            span = f"{time.time() - history.times()[0]:,.0f} s" if len(history) else "nothing yet"
            self.label.setText(f"Live · {len(history):,} changes kept (last {span})")
            self.label.setStyleSheet("")
            return
        ago = time.time() - self.frame.time
        self.label.setText(f"Showing {_clock(self.frame.time)} ({ago:,.0f} s ago) · {self._held:,} pages held then · "
                           f"the maps are the past: Live returns")
        self.label.setStyleSheet(f"color: {theme.color('warning').name()}; font-weight: bold")
