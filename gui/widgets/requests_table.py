"""RequestsTable: the requests the engine reported, newest first, active or all.

Order is by when this table first saw a request, then by slot (slots are handed out in
arrival order); state.requests moves a row to its end on every update, which would make
rows jump. A refresh where only new requests arrived
inserts rows at the top; updates in place emit dataChanged; anything else resets the
model and restores the selection by request id.
"""

from __future__ import annotations

import datetime as dt
import itertools

from PySide6.QtCore import QItemSelectionModel, QModelIndex, Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHBoxLayout,
    QLabel,
    QVBoxLayout,
    QWidget,
)

from gui import theme
from engine.wire.states import Phase
from gui.model.engine_state import EngineState, RequestRow
from gui.model.rewind import affected_at, requests_at
from gui.widgets.row_table_model import RowTableModel, row_table_view
from gui.widgets.state_view import StateView

COLUMNS = ("Request", "Tenant", "Prompt", "Phase", "Pages", "TTFT ms", "Tokens")
NUMERIC = {2, 5, 6}
FILTERS = ("Active", "All")
PHASE_COLOR = {Phase.FAILED: "danger", Phase.REJECTED: "danger", Phase.CANCELLED: "muted", Phase.FINISHED: "muted",
               Phase.DECODING: "ok"}


def pages_text(pages: dict[str, int]) -> str:
    """{"prefill-0": 2, "decode-0": 3} -> "decode-0: 3, prefill-0: 2"."""
    return ", ".join(f"{pool}: {n}" for pool, n in sorted(pages.items()))


_CELLS = (
    lambda r: r.request_id,
    lambda r: r.tenant,
    lambda r: f"{r.prompt_len:,}",
    lambda r: r.phase,
    lambda r: pages_text(r.pages),
    lambda r: "" if r.ttft_ms is None else f"{r.ttft_ms:,.1f}",
    lambda r: f"{r.tokens:,}",
)


class RequestsModel(RowTableModel):
    columns = tuple(COLUMNS)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.rows: list[RequestRow] = []
        self.affected: dict[str, str] = {}  # request id -> why data crossed for it (marked rows)
        self._stamps: list[float] = []  # row.updated at the last refresh
        # the colour key: row -> the colour its pages show in the map (the window sets it)
        self.colour_of = None

    def data(self, index, role=Qt.DisplayRole):
        if not index.isValid():
            return None
        r, col = self.rows[index.row()], index.column()
        why = self.affected.get(r.request_id)
        if role == Qt.DisplayRole:
            return f"⚠ {r.request_id}" if col == 0 and why else _CELLS[col](r)
        if role == Qt.ForegroundRole and col == 0 and why:
            return theme.color("danger")
        if role == Qt.ToolTipRole and why:
            return f"Data crossed: {r.request_id} {why}" + (f"\n{r.error.get('code', 'error')}: "
                                                           f"{r.error.get('message', '')}" if r.error else "")
        if role == Qt.DecorationRole and col in (0, 1) and self.colour_of is not None:
            return self.colour_of(r)  # a swatch: the request's (or tenant's) colour in the map
        if role == Qt.TextAlignmentRole and col in NUMERIC:
            return int(Qt.AlignRight | Qt.AlignVCenter)
        if role == Qt.ForegroundRole and col == 3 and r.phase in PHASE_COLOR:
            return theme.color(PHASE_COLOR[r.phase])
        if role == Qt.ToolTipRole and r.error:
            return f"{r.error.get('code', 'error')}: {r.error.get('message', '')}"
        return None

    def row_of(self, request_id: str) -> int:
        for i, r in enumerate(self.rows):
            if r.request_id == request_id:
                return i
        return -1

    def force_repaint(self) -> None:
        if self.rows:
            self.dataChanged.emit(self.index(0, 0), self.index(len(self.rows) - 1, len(COLUMNS) - 1))

    def update_rows(self, rows: list[RequestRow]) -> bool:
        """Swap in new rows (newest first); True when the model was reset."""
        stamps = [r.updated for r in rows]
        new = len(rows) - len(self.rows)
        if new >= 0 and all(a is b for a, b in zip(rows[new:], self.rows)):
            if new:
                self.beginInsertRows(QModelIndex(), 0, new - 1)
                self.rows, old_stamps = rows, self._stamps
                self.endInsertRows()
            else:
                old_stamps = self._stamps
                self.rows = rows
            self._stamps = stamps
            changed = [i for i, (a, b) in enumerate(zip(stamps[new:], old_stamps), new) if a != b]
            if changed:
                self.dataChanged.emit(self.index(changed[0], 0), self.index(changed[-1], len(COLUMNS) - 1))
            return False
        self.beginResetModel()
        self.rows, self._stamps = rows, stamps
        self.endResetModel()
        return True


class RequestsTable(StateView, QWidget):
    """Requests from state.requests; a row the user picks becomes the state's selection (and
    is emitted as request_selected(id)); a selection made elsewhere selects its row."""

    request_selected = Signal(str)

    def __init__(self, state: EngineState, parent=None):
        super().__init__(parent)
        self.state = state
        self._first_seen: dict[str, int] = {}  # request id -> refresh number that first saw it
        self._refreshes = itertools.count()
        self._quiet = False  # set while the table itself moves the selection
        self.model = RequestsModel(self)
        self.view = row_table_view(self.model, (110, 80, 64, 110, 200, 70, 60), stretch=4)
        self.view.selectionModel().selectionChanged.connect(self._selection_changed)

        self.filter = QComboBox()
        self.filter.addItems(FILTERS)
        self.filter.currentIndexChanged.connect(self.refresh)
        self.count_label = QLabel()
        bar = QHBoxLayout()
        bar.setContentsMargins(0, 0, 0, 0)
        bar.addWidget(QLabel("Show"))
        bar.addWidget(self.filter)
        bar.addWidget(self.count_label, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(bar)
        layout.addWidget(self.view)
        self.refresh()

    def follows(self) -> dict:
        return {"requests": self.refresh, "selection": self._follow_selection, "find": self.refresh,
                "rewind": self._follow_rewind, "crossings": self._follow_rewind, "alerts": self._follow_rewind,
                "pages": lambda: self.view.viewport().update()}  # colour swatches follow the map

    def _follow_rewind(self) -> None:
        """The time shown changed (the history slider), or what crossed: the marks and rows follow."""
        state = self.state
        affected = affected_at(state.crossings.known(), state.alerts.values(), state.rewind_to)
        if affected != self.model.affected:
            self.model.affected = affected
            self.model.force_repaint()
        self.refresh()

    def _follow_selection(self) -> None:
        request_id = self.state.selection.request_id
        if request_id != self.selected_request():
            self.select_request(request_id or "")  # "" or unknown: no row selected

    def refresh(self) -> None:
        requests = self.state.requests
        generation = next(self._refreshes)
        for rid in requests.keys() - self._first_seen.keys():
            self._first_seen[rid] = generation
        if len(self._first_seen) > len(requests):
            self._first_seen = {rid: n for rid, n in self._first_seen.items() if rid in requests}
        active_only = self.filter.currentIndex() == 0
        find, at = self.state.find, self.state.rewind_to
        then = requests_at(requests.values(), at)  # the history's moment, or now
        rows = [r for r in then if not (active_only and r.done) and find.matches(r.request_id, r.tenant)]
        rows.sort(key=lambda r: (self._first_seen[r.request_id], r.slot), reverse=True)
        selected = self.selected_request()
        if self.model.update_rows(rows) and selected is not None:
            self._select(selected, scroll=False)
        active = sum(1 for r in then if not r.done)
        found = f" · {len(rows):,} match {find.describe()}" if find.active else ""
        marked = sum(1 for r in rows if r.request_id in self.model.affected)
        crossed = f" · ⚠ {marked:,} with crossed data" if marked else ""
        if at is None:
            self.count_label.setText(f"{active:,} active, {len(requests):,} known{found}{crossed}")
            self.count_label.setStyleSheet("")
        else:
            clock = dt.datetime.fromtimestamp(at).strftime("%H:%M:%S")
            self.count_label.setText(f"as at {clock} (history): {active:,} active then, {len(then):,} arrived by "
                                     f"then{found}{crossed} · tokens as now")
            self.count_label.setStyleSheet(f"color: {theme.color('warning').name()}; font-weight: bold")

    def set_readonly(self, readonly: bool) -> None:
        """Nothing here changes the engine; present so the window can treat every view alike."""

    def selected_request(self) -> str | None:
        rows = self.view.selectionModel().selectedRows()
        return self.model.rows[rows[0].row()].request_id if rows else None

    def select_request(self, request_id: str) -> bool:
        """Select and scroll to a request (from the page map); does not emit request_selected.

        Switches the filter to All when the request is finished. False when it is unknown.
        """
        if self.model.row_of(request_id) < 0 and request_id in self.state.requests and self.filter.currentIndex() == 0:
            self.filter.setCurrentIndex(1)  # refreshes
        return self._select(request_id, scroll=True)

    def _select(self, request_id: str, scroll: bool) -> bool:
        row = self.model.row_of(request_id)
        self._quiet = True
        try:
            if row < 0:
                self.view.selectionModel().clearSelection()
                return False
            index = self.model.index(row, 0)
            self.view.selectionModel().setCurrentIndex(
                index, QItemSelectionModel.ClearAndSelect | QItemSelectionModel.Rows)
            if scroll:
                self.view.scrollTo(index, QAbstractItemView.PositionAtCenter)
            return True
        finally:
            self._quiet = False

    def _selection_changed(self, *_) -> None:
        rid = self.selected_request()
        if rid is not None and not self._quiet:
            self.state.select_request(rid)  # the page maps follow the state's selection
            self.request_selected.emit(rid)
