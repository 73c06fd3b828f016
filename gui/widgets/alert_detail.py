"""AlertDetail: the selected alert in full, and the incident scope around it: which requests
received data written by which others, through which pages, when (the engine's `scope`).

Request ids are links: clicking one selects that request in the page maps and the table.
"""

from __future__ import annotations

import datetime as dt
import html

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QTextBrowser, QVBoxLayout, QWidget

from gui import theme
from gui.model.engine_state import AlertRow, EngineState
from gui.widgets.state_view import StateView

SCOPE_MARGIN_S = 5.0  # the scope asked for: the alert's lifetime, padded on both sides


def _time(t: float) -> str:
    return dt.datetime.fromtimestamp(t).strftime("%H:%M:%S") if t else "—"


def _link(request_id: str) -> str:
    return f"<a href='request:{html.escape(request_id)}'>{html.escape(request_id)}</a>"


class AlertDetail(StateView, QWidget):
    scope_requested = Signal(float, float)  # since, until (wall-clock seconds)
    request_clicked = Signal(str)

    def __init__(self, state: EngineState, parent=None):
        super().__init__(parent)
        self.state = state
        self.alert: AlertRow | None = None
        self.pairs: list[dict] | None = None
        self.view = QTextBrowser()
        self.view.setOpenLinks(False)
        self.view.anchorClicked.connect(lambda url: self.request_clicked.emit(url.toString().removeprefix("request:")))
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.view)
        self.show_alert(None)

    def show_alert(self, alert: AlertRow | None) -> None:
        """Show `alert` and ask for the scope of its time window (again only if it moved on)."""
        same = alert is not None and self.alert is not None and alert.id == self.alert.id
        if same and alert.last_seen == self.alert.last_seen and self.pairs is not None:
            self.alert = alert
            self._render()
            return
        self.alert, self.pairs = alert, None
        self._render()
        if alert is not None:
            self.scope_requested.emit(alert.first_seen - SCOPE_MARGIN_S, alert.last_seen + SCOPE_MARGIN_S)

    def show_scope(self, pairs: list[dict]) -> None:
        self.pairs = pairs
        self._render()

    def _render(self) -> None:
        alert = self.alert
        if alert is None:
            self.view.setHtml("<p>Select an alert to see its requests, pages and the incident scope.</p>")
            return
        tone = theme.color("danger" if alert.severity == "critical" else "warning").name()
        requests = ", ".join(_link(r) for r in alert.requests) or "—"
        pages = ", ".join(str(p) for p in alert.pages[:64]) or "—"
        parts = [
            f"<p><b style='color:{tone}'>{html.escape(alert.kind)}</b> · {html.escape(alert.severity)} · "
            f"{html.escape(alert.state)}{' · acknowledged' if alert.acked else ''} · {alert.count}× · "
            f"{_time(alert.first_seen)}–{_time(alert.last_seen)}</p>",
            f"<p>{html.escape(alert.detail)}</p>",
            f"<p><b>Requests</b>: {requests}<br><b>Pages</b>{' of ' + html.escape(alert.pool) if alert.pool else ''}"
            f": {pages}</p>",
        ]
        if self.pairs is None:
            parts.append("<p><i>Asking the engine for the incident scope…</i></p>")
        elif not self.pairs:
            parts.append("<p><b>Incident scope</b>: no request received another request's data in this "
                         "window.</p>")
        else:
            rows = "".join(
                f"<tr><td>{_link(p['reader'])}</td><td>{_link(p['source']) if p.get('source') else 'slot ' + str(p['source_slot'])}</td>"
                f"<td>{len(p['pages'])}</td><td>{p['reads']}</td><td>{_time(p['first'])}–{_time(p['last'])}</td></tr>"
                for p in self.pairs)
            parts.append(f"<p><b style='color:{theme.color('danger').name()}'>Incident scope: {len(self.pairs)} "
                         "affected pair(s)</b></p><table cellspacing=6><tr><th>received</th><th>data of</th>"
                         f"<th>pages</th><th>reads</th><th>when</th></tr>{rows}</table>")
        self.view.setHtml("".join(parts))
