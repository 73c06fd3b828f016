"""AlertDetail: the selected alert in full, what to do next (its kind's runbook), and the
incident scope around it: which tenants and requests received data written by which others,
through which pages, when (the engine's `scope`), copyable as text or JSON.

Request ids are links: clicking one selects that request in the page maps and the table.
"""

from __future__ import annotations

import datetime as dt
import html
import json
import time

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QApplication, QHBoxLayout, QPushButton, QTextBrowser, QVBoxLayout, QWidget

from engine.wire.alert_kinds import BY_NAME
from engine.wire.states import AlertState
from gui import theme
from gui.model.engine_state import AlertRow, EngineState
from gui.model.scope_summary import scope_document, scope_text, tenant_pairs
from gui.widgets.state_view import StateView

SCOPE_MARGIN_S = 5.0  # the scope asked for: the alert's lifetime, padded on both sides
SCOPE_AGAIN_S = 5.0  # a firing alert's scope is asked again at most this often as it grows
MAX_PAGES_SHOWN = 64


def _time(t: float) -> str:
    return dt.datetime.fromtimestamp(t).strftime("%H:%M:%S") if t else "—"


def _link(request_id: str) -> str:
    return f"<a href='request:{html.escape(request_id)}'>{html.escape(request_id)}</a>"


def _who(pair: dict, side: str) -> str:
    """A pair's reader or source as a link, with its tenant; an unknown source by its slot."""
    rid = pair.get(side)
    name = _link(rid) if rid else f"slot {html.escape(str(pair.get(f'{side}_slot', '?')))}"
    tenant = pair.get(f"{side}_tenant")
    return f"{name} <small>({html.escape(f'tenant {tenant}' if tenant else 'no known tenant')})</small>"


def _more(left_out: int, noun: str) -> str:
    """" … +N more requests not listed" where a list is cut; "" where it is whole."""
    if not left_out:
        return ""
    return f" <b>… +{left_out:,} more {noun}{'s' if left_out != 1 else ''} not listed</b>"


def runbook_html(kind: str) -> str:
    """The "What to do next" steps of an alert kind (html-escaped); "" for a kind not declared."""
    declared = BY_NAME.get(kind)
    if declared is None:
        return ""
    steps = "".join(f"<li>{html.escape(step)}</li>" for step in declared.runbook)
    return f"<p><b>What to do next</b></p><ol>{steps}</ol>"


class AlertDetail(StateView, QWidget):
    scope_requested = Signal(float, float, str)  # since, until (wall-clock seconds), run ("": this run)
    request_clicked = Signal(str)

    def __init__(self, state: EngineState, parent=None):
        super().__init__(parent)
        self.state = state
        self.alert: AlertRow | None = None
        self.pairs: list[dict] | None = None
        self._scope_asked_at = 0.0  # monotonic time of the last scope asked for
        self.view = QTextBrowser()
        self.view.setOpenLinks(False)
        self.view.anchorClicked.connect(lambda url: self.request_clicked.emit(url.toString().removeprefix("request:")))
        self.copy_text_button = QPushButton("Copy scope as text")
        self.copy_text_button.setToolTip("One line per tenant pair: its request pairs, pages, first and last time")
        self.copy_text_button.clicked.connect(lambda: self.copy_scope("text"))
        self.copy_json_button = QPushButton("Copy scope as JSON")
        self.copy_json_button.setToolTip("The alert, the tenant pairs and every request pair, as a JSON document")
        self.copy_json_button.clicked.connect(lambda: self.copy_scope("json"))
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.copy_text_button)
        buttons.addWidget(self.copy_json_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.view)
        layout.addLayout(buttons)
        self.show_alert(None)

    def follows(self) -> dict:
        return {"alerts": self.follow_alert}

    def state_replaced(self) -> None:
        self.follow_alert()

    def follow_alert(self) -> None:
        """The alert shown as the state has it now (the table and the detail never disagree);
        an alert the state no longer holds stays as last seen."""
        if self.alert is None:
            return
        now = self.state.alerts.get(self.alert.id)
        if now is not None and now is not self.alert:
            self.show_alert(now)

    def show_alert(self, alert: AlertRow | None) -> None:
        """Show `alert` and ask for the scope of its time window: at once for another alert,
        and for the same one again when it moved on (at most every SCOPE_AGAIN_S while it
        grows; the scope shown so far stays meanwhile)."""
        same = alert is not None and self.alert is not None and alert.id == self.alert.id
        if same:
            moved = alert.last_seen != self.alert.last_seen or alert.state != self.alert.state
            self.alert = alert
            self._render()
            if moved and (alert.state != AlertState.FIRING or time.monotonic() - self._scope_asked_at >= SCOPE_AGAIN_S):
                self._ask_scope()
            return
        self.alert, self.pairs = alert, None
        self._render()
        if alert is not None and not alert.marker:
            self._ask_scope()

    def _ask_scope(self) -> None:
        self._scope_asked_at = time.monotonic()
        alert = self.alert
        # an earlier run's episode: its scope is in the engine's journal, not in its memory
        self.scope_requested.emit(alert.first_seen - SCOPE_MARGIN_S, alert.last_seen + SCOPE_MARGIN_S, alert.run)

    def show_scope(self, pairs: list[dict]) -> None:
        self.pairs = pairs
        self._render()

    def tenant_of(self, request_id: str) -> str | None:
        """A request's tenant from the requests the window knows (pairs from an older engine lack it)."""
        row = self.state.requests.get(request_id)
        return (row.tenant or None) if row is not None else None

    def copy_scope(self, form: str = "text") -> str:
        """Put the incident scope on the clipboard ("text": one line per tenant pair, or "json");
        returns what was copied ("" while there is no scope to copy)."""
        if self.alert is None or self.pairs is None:
            return ""
        if form == "json":
            text = json.dumps(scope_document(self.alert, self.pairs, self.tenant_of), indent=1)
        else:
            text = scope_text(self.alert, self.pairs, self.tenant_of)
        QApplication.clipboard().setText(text)
        return text

    def _render(self) -> None:
        alert = self.alert
        has_scope = alert is not None and self.pairs is not None
        self.copy_text_button.setEnabled(has_scope)
        self.copy_json_button.setEnabled(has_scope)
        if alert is None:
            self.view.setHtml("<p>Select an alert to see its requests, pages and the incident scope.</p>")
            return
        if alert.marker:
            self.view.setHtml(f"<p><b style='color:{theme.color('warning').name()}'>Engine restarted</b></p>"
                              f"<p>{html.escape(alert.detail)}</p>")
            return
        tone = theme.color("danger" if alert.severity == "critical" else "warning").name()
        requests = ", ".join(_link(r) for r in alert.requests) or "—"
        pages = ", ".join(str(p) for p in alert.pages[:MAX_PAGES_SHOWN]) or "—"
        gone = (" · <i>raised by the previous engine</i>" if alert.previous_engine
                else " · <i>an earlier engine run</i>" if alert.previous_run else "")
        episode = f" · episode {alert.episode}" if alert.episode else ""
        parts = [
            f"<p><b style='color:{tone}'>{html.escape(alert.kind)}</b> · {html.escape(alert.severity)} · "
            f"{html.escape(alert.state)}{' · acknowledged' if alert.acked else ''} · {alert.count:,}× · "
            f"{_time(alert.first_seen)}–{_time(alert.last_seen)}{episode}{gone}</p>",
            f"<p>{html.escape(alert.detail)}</p>",
            f"<p><b>Requests</b>: {requests}{_more(alert.requests_left_out, 'request')}"
            f"<br><b>Pages</b>{' of ' + html.escape(alert.pool) if alert.pool else ''}: {pages}"
            f"{_more(alert.pages_left_out + max(0, len(alert.pages) - MAX_PAGES_SHOWN), 'page')}</p>",
            runbook_html(alert.kind),
        ]
        if self.pairs is None:
            parts.append("<p><i>Asking the engine for the incident scope…</i></p>")
        elif not self.pairs:
            parts.append("<p><b>Incident scope</b>: no request received another request's data in this "
                         "window.</p>")
        else:
            parts.append(self._scope_html())
        self.view.setHtml("".join(parts))

    def _scope_html(self) -> str:
        """Tenants in scope (one sentence per tenant pair), then every request pair."""
        groups = tenant_pairs(self.pairs, self.tenant_of)
        tenants = "".join(
            f"<li>{html.escape(g.sentence)}: {len(g.pairs)} request pair(s), {g.pages} page(s), "
            f"{_time(g.first or 0)}–{_time(g.last or 0)}</li>" for g in groups)
        rows = "".join(
            f"<tr><td>{_who(p, 'reader')}</td><td>{_who(p, 'source')}</td><td>{len(p.get('pages') or [])}</td>"
            f"<td>{p.get('reads', 0)}</td><td>{_time(p.get('first') or 0)}–{_time(p.get('last') or 0)}</td></tr>"
            for g in groups for p in g.pairs)
        count = sum(len(g.pairs) for g in groups)
        return (f"<p><b style='color:{theme.color('danger').name()}'>Incident scope: {count} affected pair(s)</b></p>"
                f"<p><b>Tenants in scope</b></p><ul>{tenants}</ul>"
                "<table cellspacing=6><tr><th>received</th><th>data of</th><th>pages</th><th>reads</th><th>when</th>"
                f"</tr>{rows}</table>")
