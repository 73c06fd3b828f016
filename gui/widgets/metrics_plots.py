"""MetricsPlots: the last minutes of the `metrics` topic as pyqtgraph plots.

x is seconds before now (0 at the right edge): pool usage % (one curve per pool),
tokens/s, queue depth, TTFT p50 and time per output token p50. Colours follow the theme.
Every y axis starts at 0 and reads in its own unit (no SI prefix: a queue of 0 once read
"requests (x0.001)" from -200 to 200); the pool legend sits beside its plot, not on it.
Every plot shares one x span, so only the bottom row spends height on "seconds ago" ticks:
at 1024x700 the plots used to collapse to no height at all.
"""

from __future__ import annotations

import time

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, Qt
from PySide6.QtWidgets import QVBoxLayout, QWidget

from gui import theme
from gui.model.engine_state import EngineState
from gui.widgets.state_view import StateView
from gui.widgets.status_line import STALE_OPACITY, STALE_TOOLTIP

# series name -> (plot title, y unit label)
PLOTS = {
    "pool_usage": ("Pool usage", "%"),
    "tokens_per_s": ("Throughput", "tokens/s"),
    "queue_depth": ("Queue depth", "requests"),
    "ttft_ms_p50": ("Time to first token p50", "ms"),
    "tpot_ms_p50": ("Time per output token p50", "ms"),
}
GRID = {"pool_usage": (0, 0, 1, 2), "tokens_per_s": (1, 0, 1, 1), "queue_depth": (1, 1, 1, 1),
        "ttft_ms_p50": (2, 0, 1, 1), "tpot_ms_p50": (2, 1, 1, 1)}
BOTTOM_ROW = 2
MIN_HEIGHT = 300  # three rows of plots, each with a readable data area (about 60 px)
TITLE_HEIGHT = 20  # pyqtgraph gives a 9 pt title 30 px
GAP_S = 3.5  # metrics come once a second: a longer silence is an outage, not a slope


def y_top(values: np.ndarray, floor: float = 1.0) -> float:
    """The top of a y range starting at 0: a little above the largest value, at least `floor`."""
    finite = values[np.isfinite(values)] if len(values) else values
    top = float(finite.max()) if len(finite) else 0.0
    return max(floor, top * 1.1)


class SecondsAgoAxis(pg.AxisItem):
    """x values are negative seconds from now; the ticks read as positive "seconds ago"."""

    def tickStrings(self, values, scale, spacing):
        return [f"{abs(v) * scale:g}" for v in values]


def series_xy(series, now: float, span_s: float, gap_s: float = GAP_S) -> tuple[np.ndarray, np.ndarray]:
    """(monotonic time, value) pairs -> (seconds relative to now, values) within span_s, with
    a NaN between two samples more than gap_s apart: the curve breaks there (drawn with
    connect="finite") instead of drawing a straight line across an outage."""
    if not series:
        return np.empty(0), np.empty(0)
    data = np.asarray(series, dtype=float)
    x, y = data[:, 0] - now, data[:, 1]
    keep = x >= -span_s
    x, y = x[keep], y[keep]
    gaps = np.flatnonzero(np.diff(x) > gap_s) + 1
    if len(gaps):
        x = np.insert(x, gaps, (x[gaps - 1] + x[gaps]) / 2)
        y = np.insert(y, gaps, np.nan)
    return x, y


class MetricsPlots(StateView, QWidget):
    def __init__(self, state: EngineState, span_s: float = 300.0, parent=None):
        super().__init__(parent)
        self.state = state
        self.span_s = span_s
        self.stale = False
        self.restart_lines: dict[str, list[pg.InfiniteLine]] = {}  # plot -> a line per engine restart shown
        self.graphics = pg.GraphicsLayoutWidget()
        self.plots: dict[str, pg.PlotItem] = {}
        self.curves: dict[str, pg.PlotDataItem] = {}  # series name, or "pool:<name>"
        for name, (title, unit) in PLOTS.items():
            row, col, rows, cols = GRID[name]
            if name == "pool_usage":  # its own row: the plot, then its legend beside it
                top = self.graphics.addLayout(row=row, col=col, rowspan=rows, colspan=cols)
                plot = top.addPlot(row=0, col=0, axisItems={"bottom": SecondsAgoAxis("bottom")})
            else:
                plot = self.graphics.addPlot(row=row, col=col, rowspan=rows, colspan=cols,
                                             axisItems={"bottom": SecondsAgoAxis("bottom")})
            plot.setMenuEnabled(False)
            plot.setMouseEnabled(x=False, y=False)
            plot.hideButtons()
            plot.showGrid(x=True, y=True, alpha=0.2)
            plot.setXRange(-span_s, 0, padding=0)
            plot.getAxis("left").enableAutoSIPrefix(False)
            plot.enableAutoRange(axis="y", enable=False)  # refresh() sets 0..top
            plot.setYRange(0, 1, padding=0)
            plot.setLabel("left", unit)
            if row == BOTTOM_ROW:
                plot.setLabel("bottom", "seconds ago")
            else:  # the same x ticks as the bottom row: grid lines only
                plot.getAxis("bottom").setStyle(showValues=False)
                plot.getAxis("bottom").setHeight(4)
            self.plots[name] = plot
            if name != "pool_usage":
                self.curves[name] = plot.plot([], [], connect="finite")
        self.plots["pool_usage"].setYRange(0, 100, padding=0.02)
        self.legend = pg.LegendItem()
        top.addItem(self.legend, row=0, col=1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.graphics)
        self.setMinimumHeight(MIN_HEIGHT)
        self._apply_colors()
        self.refresh()

    def follows(self) -> dict:
        return {"metrics": self.refresh, "stale": self._follow_stale, "frame": self._follow_clock}

    def _follow_clock(self) -> None:
        """Between metrics (an outage) the curves and marks still move left with the clock."""
        if self.state.stale:
            self.refresh()

    def _follow_stale(self) -> None:
        self.set_stale(bool(self.state.stale))
        self.refresh()

    def refresh(self, now: float | None = None) -> None:
        """Re-read the metric series; x is recomputed because "now" moves."""
        now = time.monotonic() if now is None else now
        for name, series in self.state.metrics.items():
            if name in self.curves:
                x, y = series_xy(series, now, self.span_s)
                self.curves[name].setData(x, y)
                self.plots[name].setYRange(0, y_top(y), padding=0)
        for pool, series in sorted(self.state.pool_usage.items()):
            key = f"pool:{pool}"
            if key not in self.curves:
                self.curves[key] = self.plots["pool_usage"].plot([], [], connect="finite")
                self.legend.addItem(self.curves[key], pool)
                self._apply_colors()
            self.curves[key].setData(*series_xy(series, now, self.span_s))
        self._mark_restarts(now)

    def _mark_restarts(self, now: float) -> None:
        """A vertical line on every plot where the engine restarted (within the span)."""
        xs = [r.monotonic - now for r in self.state.restarts if r.monotonic - now >= -self.span_s]
        pen = pg.mkPen(theme.color("warning").name(), width=1, style=Qt.PenStyle.DashLine)
        for name, plot in self.plots.items():
            lines = self.restart_lines.setdefault(name, [])
            while len(lines) < len(xs):
                line = pg.InfiniteLine(angle=90, movable=False, pen=pen,
                                       label="restart" if name == "pool_usage" else None,
                                       labelOpts={"position": 0.9, "color": theme.color("warning").name()})
                plot.addItem(line, ignoreBounds=True)
                lines.append(line)
            while len(lines) > len(xs):
                plot.removeItem(lines.pop())
            for line, x in zip(lines, xs):
                line.setPos(x)

    def state_replaced(self) -> None:
        self.refresh()  # the marks of the state shown now

    def set_readonly(self, readonly: bool) -> None:
        """Plots have no controls; present so the window can treat every view alike."""

    def set_stale(self, stale: bool) -> None:
        """Grey the plots while telemetry is stale: the opacity of the plot items inside the
        scene. (A QGraphicsOpacityEffect on a widget holding a QGraphicsView crashed the
        process in a later paint once the effect had been removed.)"""
        for plot in self.plots.values():
            plot.setOpacity(STALE_OPACITY if stale else 1.0)
        self.legend.setOpacity(STALE_OPACITY if stale else 1.0)
        self.setToolTip(STALE_TOOLTIP if stale else "")
        self.stale = stale

    def set_theme(self, mode: str) -> None:
        """Recolour for "dark" or "light" (a palette change does this too)."""
        self._apply_colors(mode)

    def changeEvent(self, event) -> None:
        if event.type() in (QEvent.PaletteChange, QEvent.ApplicationPaletteChange):
            self._apply_colors()
        super().changeEvent(event)

    def _apply_colors(self, mode: str | None = None) -> None:
        mode = mode or theme.current_mode()
        background, foreground = theme.plot_colors(mode)
        self.graphics.setBackground(background)
        for name, plot in self.plots.items():
            plot.setTitle(PLOTS[name][0], color=foreground, size="9pt")
            plot.titleLabel.setMaximumHeight(TITLE_HEIGHT)  # setTitle sets 30 px each time
            plot.layout.setRowFixedHeight(0, TITLE_HEIGHT)
            for side in ("left", "bottom"):
                axis = plot.getAxis(side)
                axis.setPen(foreground)
                axis.setTextPen(foreground)
        self.legend.setLabelTextColor(foreground)
        for _sample, label in self.legend.items:
            label.setText(label.text)  # setLabelTextColor alone does not re-render existing labels
        pools = sorted(k for k in self.curves if k.startswith("pool:"))
        for i, key in enumerate(pools):
            self.curves[key].setPen(pg.mkPen(theme.series_color(i, mode), width=2))
        for i, name in enumerate(n for n in PLOTS if n != "pool_usage"):
            self.curves[name].setPen(pg.mkPen(theme.series_color(i, mode), width=2))
