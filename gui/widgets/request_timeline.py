"""RequestTimeline: the selected request's life: queued → reserving pages → awaiting prefill →
prefill + transfer → decoding → its end, as the engine's telemetry stamped each phase.

A bar of the phases in proportion to their durations (a running request's last phase grows
with the clock), the first token marked on it, and a table of phase, start, duration. A
request seen only after it began says so ("arrived" at its arrival, then what was seen).
"""

from __future__ import annotations

import datetime as dt
import time
from html import escape

from PySide6.QtCore import QRectF, QSize
from PySide6.QtGui import QColor, QPainter, QPen
from PySide6.QtWidgets import QLabel, QSizePolicy, QTextBrowser, QVBoxLayout, QWidget

from gui import theme
from engine.wire.states import END_PHASES, RUNNING_PHASES, Phase
from gui.model.engine_state import RequestRow
from gui.widgets.state_view import StateView

ARRIVED = "arrived"  # not a phase: a request first seen after it began (the app joined late)
PHASE_LABELS = {ARRIVED: "arrived (seen later)", **{p: p.value for p in Phase},
                Phase.RESERVING: "reserving pages", Phase.AWAITING_PREFILL: "awaiting prefill",
                Phase.PREFILLING: "prefill + transfer"}
RUNNING = (ARRIVED, *RUNNING_PHASES)  # series colours
END_TONES = {Phase.FINISHED: "ok", Phase.FAILED: "danger", Phase.REJECTED: "warning", Phase.CANCELLED: "warning"}
ENDS = END_PHASES


def _clock(t: float) -> str:
    return dt.datetime.fromtimestamp(t).strftime("%H:%M:%S.%f")[:-3]


def segments(row: RequestRow, now: float) -> list[tuple[str, float, float]]:
    """(phase, start, end) of each phase seen; an end phase is an instant."""
    out = []
    for i, (phase, start) in enumerate(row.timeline):
        if phase in ENDS:
            out.append((phase, start, start))
            continue
        end = row.timeline[i + 1][1] if i + 1 < len(row.timeline) else now
        out.append((phase, start, max(start, end)))
    return out


def _table_rows(parts: list[tuple[str, float, float]]) -> list[tuple[str, str, str]]:
    """(phase label, start clock, duration) of each segment: the bar and the table share one
    clock reading."""
    return [(PHASE_LABELS.get(phase, phase), _clock(start), "—" if phase in ENDS else f"{1e3 * (end - start):,.1f} ms")
            for phase, start, end in parts]


def _tone(phase: str) -> QColor:
    if phase in RUNNING:
        return theme.series_color(RUNNING.index(phase))
    return theme.color(END_TONES.get(phase, "muted"))


class TimelineBar(QWidget):
    """The phases side by side, widths in proportion to their durations."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.parts: list[tuple[str, float, float]] = []
        self.first_token: float | None = None
        self.setMinimumHeight(26)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt's name)
        return QSize(300, 26)

    def set_parts(self, parts: list[tuple[str, float, float]], first_token: float | None) -> None:
        self.parts, self.first_token = parts, first_token
        self.update()

    def paintEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        if not self.parts:
            return
        p = QPainter(self)
        t0, t1 = self.parts[0][1], max(end for _, _, end in self.parts)
        span = max(t1 - t0, 1e-6)
        width, height = self.width() - 2, self.height() - 2
        for phase, start, end in self.parts:
            x = 1 + width * (start - t0) / span
            w = max(2.0, width * (end - start) / span)
            p.fillRect(QRectF(x, 1, w, height), _tone(phase))
        if self.first_token is not None and t0 <= self.first_token <= t1:
            x = 1 + width * (self.first_token - t0) / span
            p.setPen(QPen(self.palette().text().color(), 2))
            p.drawLine(int(x), 0, int(x), self.height())
        p.end()


class RequestTimeline(StateView, QWidget):
    def __init__(self, state, parent=None):
        super().__init__(parent)
        self.header = QLabel("Select a request to see its timeline.")
        self.header.setWordWrap(True)
        self.bar = TimelineBar()
        self.table = QTextBrowser()
        self.table.setOpenLinks(False)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.header)
        layout.addWidget(self.bar)
        layout.addWidget(self.table, 1)
        self.request_id: str | None = None
        self.state = state
        self.refresh()

    def follows(self) -> dict:
        return {"selection": self.refresh, "requests": self.refresh, "frame": self._tick}

    def state_replaced(self) -> None:
        self.refresh()

    def _tick(self) -> None:
        row = self.state.requests.get(self.request_id) if self.request_id else None
        if row is not None and not row.done:  # a running request's last phase grows
            self.refresh()

    def rows(self) -> list[tuple[str, str, str]]:
        """(phase label, start clock, duration) of the request shown, for tests and copying."""
        row = self.state.requests.get(self.request_id) if self.request_id else None
        return _table_rows(segments(row, time.time())) if row is not None else []

    def refresh(self) -> None:
        rid = self.state.selected_request
        row = self.state.requests.get(rid) if rid else None
        self.request_id = rid if row is not None else None
        if row is None:
            self.header.setText("Select a request to see its timeline." if not rid else
                                f"Request {escape(rid)} is not known to this window (it ended before it joined, "
                                "or it was dropped from the table).")
            self.bar.set_parts([], None)
            self.table.setHtml("")
            return
        now = time.time()
        parts = segments(row, now)
        total = (parts[-1][2] - row.arrival) if parts and row.arrival is not None else 0.0
        ttft = f" · first token after {1e3 * (row.first_token_at - row.arrival):,.0f} ms" \
            if row.first_token_at is not None and row.arrival is not None else ""
        state = row.phase if row.done else f"{row.phase}, running"
        self.header.setText(f"<b>{escape(row.request_id)}</b> · tenant {escape(row.tenant or '?')} · slot {row.slot} · "
                            f"prompt {row.prompt_len:,} tokens · {row.tokens:,} generated · {escape(state)} · "
                            f"{1e3 * total:,.0f} ms since arrival{ttft}")
        self.bar.set_parts(parts, row.first_token_at)
        cells = "".join(f"<tr><td><span style='color:{_tone(p).name()}'>■</span> {escape(label)}</td>"
                        f"<td>{start}</td><td align='right'>{duration}</td></tr>"
                        for (p, _, _), (label, start, duration) in zip(parts, _table_rows(parts)))
        self.table.setHtml(f"<table cellspacing='6'><tr><th align='left'>phase</th><th align='left'>began</th>"
                           f"<th align='right'>lasted</th></tr>{cells}</table>")
