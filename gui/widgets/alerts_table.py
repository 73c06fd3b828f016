"""AlertsTable: the engine's alerts, newest first, with acknowledge and snapshot export.

The model keeps the row objects of its last refresh; an unchanged state costs one identity
comparison, changed rows one dataChanged, and only a changed row set resets the model
(the selection is restored by alert id).
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict

from PySide6.QtCore import QItemSelection, QItemSelectionModel, QModelIndex, Qt, Signal
from PySide6.QtGui import QAction, QFont, QKeySequence
from PySide6.QtWidgets import (
    QApplication,
    QComboBox,
    QHBoxLayout,
    QLabel,
    QMenu,
    QPushButton,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from gui import theme
from engine.wire.states import AlertState
from gui.model.engine_state import AlertRow, EngineState
from gui.widgets.row_table_model import RowTableModel, row_table_view
from gui.widgets.state_view import StateView

COLUMNS = ("Last seen", "Severity", "Kind", "Requests", "Pages", "Detail", "State", "Ack")
FILTERS = ("All alerts", "Unresolved")


def short_list(items: list, limit: int = 3, left_out: int = 0) -> str:
    """"r1, r2, r3 +4" — the first few items and how many more (`left_out`: more the list
    itself does not hold)."""
    shown = ", ".join(str(i) for i in items[:limit])
    more = max(0, len(items) - limit) + left_out
    return shown + (f" +{more:,}" if more else "")


def page_ranges(pages: list[int], limit: int = 4, left_out: int = 0) -> str:
    """[3, 4, 5, 9] -> "3–5, 9"; after `limit` ranges, how many pages more."""
    ranges: list[list[int]] = []
    for page in sorted(set(pages)):
        if ranges and page == ranges[-1][1] + 1:
            ranges[-1][1] = page
        else:
            ranges.append([page, page])
    text = ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in ranges[:limit])
    rest = sum(b - a + 1 for a, b in ranges[limit:]) + left_out
    return text + (f" +{rest:,}" if rest else "")


def state_text(a: AlertRow) -> str:
    """The State column: the state, how often, and whose run it was."""
    if a.marker:
        return "engine restarted"
    episode = f" · episode {a.episode}" if a.episode and a.episode > 1 else ""
    gone = " · previous engine" if a.previous_engine else " · previous run" if a.previous_run else ""
    return a.state + (f" ×{a.count:,}" if a.count > 1 else "") + episode + gone


def local_time(timestamp: float) -> str:
    """A wall-clock timestamp as local HH:MM:SS (with the date when it is not today)."""
    when = dt.datetime.fromtimestamp(timestamp)
    return when.strftime("%H:%M:%S" if when.date() == dt.date.today() else "%Y-%m-%d %H:%M:%S")


_CELLS = (
    lambda a: local_time(a.last_seen),
    lambda a: a.severity,
    lambda a: a.kind,
    lambda a: short_list(a.requests, left_out=a.requests_left_out),
    lambda a: page_ranges(a.pages, left_out=a.pages_left_out),
    lambda a: a.detail.splitlines()[0] if a.detail else "",
    state_text,
    lambda a: "yes" if a.acked and not a.marker else "",
)


def alert_text(a: AlertRow) -> str:
    """One alert as plain text for a ticket or a chat: every field, the detail whole."""
    if a.marker:
        return f"{local_time(a.first_seen)} {a.detail}"
    gone = (" (raised by the previous engine)" if a.previous_engine
            else " (an earlier engine run)" if a.previous_run else "")
    more = f" (+{a.requests_left_out:,} more not listed)" if a.requests_left_out else ""
    more_pages = f" (+{a.pages_left_out:,} more not listed)" if a.pages_left_out else ""
    return "\n".join([
        f"{a.kind} · {a.severity} · {a.state}{' · acknowledged' if a.acked else ''}{gone}"
        + (f" · episode {a.episode}" if a.episode else ""),
        f"first seen {local_time(a.first_seen)}, last seen {local_time(a.last_seen)}, {a.count}×"
        + (f" · pool {a.pool}" if a.pool else ""),
        f"requests: {', '.join(a.requests) or '-'}{more}",
        f"pages: {page_ranges(a.pages) or '-'}{more_pages}",
        a.detail,
    ]).rstrip()


def acknowledge_enabled(rows: list[AlertRow], readonly: bool) -> bool:
    """Acknowledge is possible when not read-only and a selected alert is unacknowledged."""
    return not readonly and any(row.ackable for row in rows)


class AlertsModel(RowTableModel):
    columns = tuple(COLUMNS)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.rows: list[AlertRow] = []

    def data(self, index, role=Qt.DisplayRole):
        if not index.isValid():
            return None
        row, col = self.rows[index.row()], index.column()
        if role == Qt.DisplayRole:
            return _CELLS[col](row)
        if role == Qt.ToolTipRole:
            if row.marker:
                return row.detail
            return (f"{row.kind} ({row.severity}, {row.state})\nfirst seen {local_time(row.first_seen)}, "
                    f"last seen {local_time(row.last_seen)}, {row.count}×\nrequests: {', '.join(row.requests) or '-'}"
                    f"\npages: {', '.join(map(str, row.pages)) or '-'}\n\n{row.detail}")
        if role == Qt.ForegroundRole:
            if row.marker:
                return theme.color("warning")
            if col == 1 and not row.gone:
                return theme.severity_color(row.severity)
            if row.state == AlertState.RESOLVED or row.gone:
                return theme.color("muted")
        if role == Qt.FontRole and (row.marker or row.gone or row.live_firing and not row.acked):
            font = QFont()
            font.setBold(row.marker or row.live_firing)
            font.setItalic(row.gone)
            return font
        return None


class WholeRowCopyView(QTableView):
    """A table whose Ctrl+C asks for whole rows: a QTableView claims the key for one cell
    before any shortcut sees it."""

    copy_requested = Signal()

    def keyPressEvent(self, event) -> None:
        if event.matches(QKeySequence.Copy):
            self.copy_requested.emit()
        else:
            super().keyPressEvent(event)


class AlertsTable(StateView, QWidget):
    """Alerts over state.alerts; commands leave as signals."""

    acknowledge_requested = Signal(list)  # alert ids
    snapshot_requested = Signal(str)  # alert id

    def __init__(self, state: EngineState, parent=None):
        super().__init__(parent)
        self.state = state
        self._readonly = False
        self.model = AlertsModel(self)
        self.view = row_table_view(self.model, (74, 66, 150, 110, 80, 260, 80, 40), stretch=5, multi=True,
                                   view_class=WholeRowCopyView)
        self.view.setContextMenuPolicy(Qt.CustomContextMenu)
        self.view.customContextMenuRequested.connect(self._context_menu)
        self.view.selectionModel().selectionChanged.connect(self._update_actions)

        self.filter = QComboBox()
        self.filter.addItems(FILTERS)
        self.filter.currentIndexChanged.connect(self.refresh)
        self.count_label = QLabel()
        self.acknowledge_action = QAction("Acknowledge", self)
        self.acknowledge_action.triggered.connect(self.acknowledge_selected)
        self.snapshot_action = QAction("Export incident snapshot…", self)
        self.snapshot_action.triggered.connect(self._snapshot)
        # Ctrl+C (and the context menu) copies whole alerts, not one cell
        self.copy_action = QAction("Copy", self)
        self.copy_action.setShortcut(QKeySequence.Copy)
        self.copy_action.setShortcutContext(Qt.WidgetWithChildrenShortcut)  # shown in the menu
        self.copy_action.triggered.connect(lambda: self.copy_selected("text"))
        self.view.copy_requested.connect(lambda: self.copy_selected("text"))
        self.copy_json_action = QAction("Copy as JSON", self)
        self.copy_json_action.triggered.connect(lambda: self.copy_selected("json"))
        self.view.addAction(self.copy_action)
        self.acknowledge_button = QPushButton("Acknowledge")
        self.acknowledge_button.clicked.connect(self.acknowledge_selected)

        bar = QHBoxLayout()
        bar.setContentsMargins(0, 0, 0, 0)
        bar.addWidget(QLabel("Show"))
        bar.addWidget(self.filter)
        bar.addWidget(self.count_label, 1)
        bar.addWidget(self.acknowledge_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(bar)
        layout.addWidget(self.view)
        self.refresh()

    def follows(self) -> dict:
        return {"alerts": self.refresh, "find": self.refresh}

    # ---- state -> view ------------------------------------------------------------------
    def refresh(self) -> None:
        unresolved_only = self.filter.currentIndex() == 1
        alerts = self.state.alerts.values()
        find, tenant = self.state.find, self.state.tenant_of_request
        rows = [a for a in alerts if not (unresolved_only and a.state == AlertState.RESOLVED)
                and (not find.active or a.marker or any(find.matches(r, tenant(r)) for r in a.requests))]
        rows.reverse()  # arrival order breaks last_seen ties, newest first
        rows.sort(key=lambda a: a.last_seen, reverse=True)
        selected = self.selected_ids()
        if self.model.update_rows(rows) and selected:
            self._select_ids(selected)
        firing = sum(1 for a in rows if a.live_firing)
        self.count_label.setText(f"{len(rows):,} shown, {firing:,} firing")
        self._update_actions()

    def set_readonly(self, readonly: bool) -> None:
        self._readonly = bool(readonly)
        self._update_actions()

    def selected_rows(self) -> list[AlertRow]:
        return [self.model.rows[i.row()] for i in self.view.selectionModel().selectedRows()]

    def selected_ids(self) -> list[str]:
        return [row.id for row in self.selected_rows()]

    def _select_ids(self, ids: list[str]) -> None:
        wanted = set(ids)
        selection = QItemSelection()
        for i, row in enumerate(self.model.rows):
            if row.id in wanted:
                selection.select(self.model.index(i, 0), self.model.index(i, len(COLUMNS) - 1))
        self.view.selectionModel().select(selection, QItemSelectionModel.ClearAndSelect)

    def _update_actions(self, *_) -> None:
        enabled = acknowledge_enabled(self.selected_rows(), self._readonly)
        self.acknowledge_action.setEnabled(enabled)
        self.acknowledge_button.setEnabled(enabled)
        # export reads the engine's records only, so read-only sessions keep it
        self.snapshot_action.setEnabled(bool(self.view.selectionModel().selectedRows()))

    # ---- commands -------------------------------------------------------------------------
    def acknowledge_selected(self) -> None:
        """Emit acknowledge_requested with the selected unacknowledged alerts (if allowed)."""
        rows = self.selected_rows()
        if acknowledge_enabled(rows, self._readonly):
            self.acknowledge_requested.emit([r.id for r in rows if r.ackable])

    def copy_selected(self, form: str = "text") -> str:
        """Put the selected alerts on the clipboard, whole ("text": one block per alert, or
        "json"); returns what was copied."""
        rows = self.selected_rows()
        if form == "json":
            text = json.dumps([asdict(r) for r in rows], indent=1)
        else:
            text = "\n\n".join(alert_text(r) for r in rows)
        QApplication.clipboard().setText(text)
        return text

    def _snapshot(self) -> None:
        index = self.view.currentIndex()
        rows = self.selected_rows()
        if index.isValid() and self.view.selectionModel().isRowSelected(index.row(), QModelIndex()):
            self.snapshot_requested.emit(self.model.rows[index.row()].id)
        elif rows:
            self.snapshot_requested.emit(rows[0].id)

    def context_menu(self) -> QMenu:
        """The menu a right click shows (built fresh so its actions reflect the selection)."""
        self._update_actions()
        menu = QMenu(self)
        menu.addAction(self.acknowledge_action)
        menu.addAction(self.snapshot_action)
        menu.addSeparator()
        menu.addAction(self.copy_action)
        menu.addAction(self.copy_json_action)
        return menu

    def _context_menu(self, pos) -> None:
        index = self.view.indexAt(pos)
        if index.isValid() and not self.view.selectionModel().isRowSelected(index.row(), QModelIndex()):
            self.view.selectRow(index.row())
        self.context_menu().exec(self.view.viewport().mapToGlobal(pos))
