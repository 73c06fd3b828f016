"""WorkersPanel: one row per worker process, and Start / Stop / Restart / Reconfigure….

Which buttons are enabled is `actions_enabled(row, readonly, connected)`, a pure function
recomputed on every refresh and selection change. Stop and Restart fail the worker's
in-flight requests, so they ask first. In a narrow dock the other columns shrink (their
text elided) before the pool usage column does: `column_widths`.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtWidgets import (
    QApplication,
    QHBoxLayout,
    QMessageBox,
    QPushButton,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionProgressBar,
    QVBoxLayout,
    QWidget,
)

from gui import theme
from engine.wire.states import WORKER_STARTABLE, WORKER_UP, WorkerState
from gui.model.engine_state import EngineState, WorkerRow
from gui.widgets.row_table_model import RowTableModel, row_table_view
from gui.widgets.state_view import StateView

COLUMNS = ("Worker", "Role", "State", "PID", "Device", "Restarts", "Age", "Pool usage")
RESTARTS_COLUMN, AGE_COLUMN, USAGE_COLUMN = 5, 6, 7
WIDTHS = (84, 56, 64, 56, 56, 64, 48, 150)  # preferred; the usage column stretches beyond its share
USAGE_MIN_WIDTH = 110  # "4,096/4,096" in a bar
MIN_COLUMN_WIDTH = 20  # elided to a letter or two: the usage column must keep its room
STARTABLE = WORKER_STARTABLE
RUNNING = WORKER_UP
STATE_COLOR = {WorkerState.READY: "ok", WorkerState.CRASHED: "danger", WorkerState.STARTING: "warning",
               WorkerState.DRAINING: "warning", WorkerState.STOPPING: "warning", WorkerState.STOPPED: "muted"}


def actions_enabled(worker: WorkerRow | None, readonly: bool, connected: bool = True) -> dict[str, bool]:
    """Which worker actions are possible: keys start, stop, restart, reconfigure."""
    live = connected and not readonly
    state = worker.state if worker is not None else None
    return {
        "start": live and state in STARTABLE,
        "stop": live and state in RUNNING,
        "restart": live and state in RUNNING,
        "reconfigure": live,
    }


def column_widths(available: int, widths: tuple[int, ...] = WIDTHS, keep: int = USAGE_COLUMN,
                  keep_min: int = USAGE_MIN_WIDTH, floor: int = MIN_COLUMN_WIDTH) -> list[int]:
    """Column widths for `available` pixels: the preferred `widths` while the others leave
    `keep_min` for column `keep`; narrower, the others shrink in proportion (to `floor` at
    least) so that column `keep` still gets `keep_min`."""
    others = sum(w for i, w in enumerate(widths) if i != keep)
    room = available - keep_min
    scale = min(1.0, room / others) if others > 0 else 1.0
    fitted = [w if i == keep else max(floor, int(w * scale)) for i, w in enumerate(widths)]
    fitted[keep] = max(keep_min, available - sum(w for i, w in enumerate(fitted) if i != keep))
    return fitted


def age_text(seconds: float | None) -> str:
    """A process's age, short enough for a narrow column: "42s", "12m", "3.5h", "2.1d"; "—" when
    not running."""
    if seconds is None:
        return "—"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172_800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86_400:.1f}d"


def usage_text(worker: WorkerRow) -> str:
    if not worker.pages:
        return "—"
    return f"{worker.used_pages or 0:,}/{worker.pages:,}"


class WorkersModel(RowTableModel):
    columns = tuple(COLUMNS)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.rows: list[WorkerRow] = []
        self.stale = False  # the engine stopped answering: rows are the last known

    def data(self, index, role=Qt.DisplayRole):
        if not index.isValid():
            return None
        w, col = self.rows[index.row()], index.column()
        if role == Qt.DisplayRole:
            state = f"{w.state}?" if self.stale else w.state
            pid = "" if w.pid is None else (f"({w.pid})" if self.stale else str(w.pid))
            return (w.name, w.role, state, pid, w.device or "—", f"{w.restarts:,}", age_text(w.age_s()),
                    usage_text(w))[col]
        if role == Qt.TextAlignmentRole and col in (RESTARTS_COLUMN, AGE_COLUMN):
            return int(Qt.AlignRight | Qt.AlignVCenter)
        if role == Qt.UserRole and col == USAGE_COLUMN:
            return (w.used_pages or 0, w.pages or 0)
        if role == Qt.ForegroundRole and (col == 2 or self.stale):
            return theme.color("muted" if self.stale else STATE_COLOR.get(w.state, "muted"))
        if role == Qt.ForegroundRole and col == RESTARTS_COLUMN and w.restarts:
            return theme.color("warning")
        if role == Qt.ToolTipRole:
            extra = f"\n{w.reason}" if w.reason else ""
            known = ("No answer from the engine: this is the last known state, not the state now.\n"
                     if self.stale else "")
            return (f"{known}{w.name}: {w.state}, {w.inflight} in-flight request(s), pool {w.pool}, "
                    f"restarted {w.restarts:,} time(s) since the engine started{extra}")
        return None

    def set_stale(self, stale: bool) -> None:
        """The engine stopped answering: every row reads as last known ("ready?"), greyed."""
        if stale != self.stale:
            self.stale = stale
            if self.rows:
                self.dataChanged.emit(self.index(0, 0), self.index(len(self.rows) - 1, len(self.columns) - 1))

    def row_key(self, row: WorkerRow) -> str:
        return row.name


class UsageBarDelegate(QStyledItemDelegate):
    """Draws the pool usage as a small progress bar labelled used/pages."""

    def paint(self, painter, option, index) -> None:
        used, pages = index.data(Qt.UserRole) or (0, 0)
        if not pages:
            return super().paint(painter, option, index)
        bar = QStyleOptionProgressBar()
        bar.rect = option.rect.adjusted(3, 3, -3, -3)
        bar.minimum, bar.maximum, bar.progress = 0, pages, min(used, pages)
        bar.text = index.data(Qt.DisplayRole)
        bar.textVisible = True
        bar.textAlignment = Qt.AlignCenter
        bar.state = option.state | QStyle.State_Horizontal  # Fusion draws vertical bars without it
        bar.palette = option.palette
        style = option.widget.style() if option.widget else QApplication.style()
        style.drawControl(QStyle.CE_ProgressBar, bar, painter, option.widget)


class WorkersPanel(StateView, QWidget):
    """Workers from state.workers; commands leave as `command_requested(op, worker)`."""

    command_requested = Signal(str, str)  # op ("start" | "stop" | "restart"), worker name
    reconfigure_requested = Signal()

    def __init__(self, state: EngineState, parent=None):
        super().__init__(parent)
        self.state = state
        self._readonly = False
        self._connected = True
        self.model = WorkersModel(self)
        self.view = row_table_view(self.model, WIDTHS, stretch=USAGE_COLUMN, row_padding=10, striped=False)
        self.view.viewport().installEventFilter(self)  # refit the columns to every new width
        self.view.setItemDelegateForColumn(USAGE_COLUMN, UsageBarDelegate(self.view))
        self.view.selectionModel().selectionChanged.connect(self._update_buttons)

        self.buttons = {
            "start": QPushButton("Start"), "stop": QPushButton("Stop"),
            "restart": QPushButton("Restart"), "reconfigure": QPushButton("Reconfigure…"),
        }
        for op in ("start", "stop", "restart"):
            self.buttons[op].clicked.connect(lambda _=False, op=op: self.ask(op))
        self.buttons["reconfigure"].clicked.connect(self.reconfigure_requested)
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        for button in self.buttons.values():
            row.addWidget(button)
        row.addStretch(1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.view)
        layout.addLayout(row)
        self.refresh()

    def eventFilter(self, watched, event) -> bool:
        if event.type() == QEvent.Resize and watched is self.view.viewport():
            self.fit_columns()
        return super().eventFilter(watched, event)

    def fit_columns(self) -> None:
        """Size the columns to the viewport (see column_widths); the usage column stretches."""
        header = self.view.horizontalHeader()
        for col, width in enumerate(column_widths(self.view.viewport().width())):
            if col != USAGE_COLUMN:
                header.resizeSection(col, width)

    def follows(self) -> dict:
        return {"workers": self.refresh, "pages": self.refresh, "connection": self.refresh, "stale": self.refresh,
                "frame": self._tick_age}

    def _tick_age(self) -> None:
        """The age column moves with the clock, between the engine's reports."""
        if self.model.rows:
            self.model.dataChanged.emit(self.model.index(0, AGE_COLUMN), self.model.index(len(self.model.rows) - 1,
                                                                                          AGE_COLUMN))

    def refresh(self) -> None:
        self.model.set_stale(bool(self.state.stale))
        selected = self.selected_worker()
        if self.model.update_rows(self.state.workers_with_live_usage()) and selected is not None:
            self.select_worker(selected.name)
        self._update_buttons()

    def set_readonly(self, readonly: bool) -> None:
        self._readonly = bool(readonly)
        self._update_buttons()

    def set_connected(self, connected: bool) -> None:
        self._connected = bool(connected)
        self._update_buttons()

    def selected_worker(self) -> WorkerRow | None:
        rows = self.view.selectionModel().selectedRows()
        return self.model.rows[rows[0].row()] if rows else None

    def select_worker(self, name: str) -> None:
        for i, w in enumerate(self.model.rows):
            if w.name == name:
                self.view.selectRow(i)
                return

    def enabled(self) -> dict[str, bool]:
        return actions_enabled(self.selected_worker(), self._readonly, self._connected)

    def _update_buttons(self, *_) -> None:
        for op, allowed in self.enabled().items():
            self.buttons[op].setEnabled(allowed)

    def ask(self, op: str, worker: WorkerRow | str | None = None) -> bool:
        """Emit command_requested(op, name) for `worker` (default: the selected one) when its state
        allows it; Stop and Restart ask for confirmation first. True when the command left."""
        name = worker.name if isinstance(worker, WorkerRow) else worker
        if name is not None:
            self.select_worker(name)
        row = self.selected_worker()
        if row is None or not self.enabled()[op]:
            return False
        if op in ("stop", "restart") and not self._confirm(op, row):
            return False
        row = self.selected_worker()  # the state may have moved while the question was open
        if row is None or not self.enabled()[op]:
            return False
        self.command_requested.emit(op, row.name)
        return True

    def _confirm(self, op: str, worker: WorkerRow) -> bool:
        n = worker.inflight
        fate = (f"Its {n} in-flight request{'s' if n != 1 else ''} will fail with "
                f"\"worker {worker.name} was stopped\" and its pages are freed."
                if n else "It has no in-flight requests.")
        after = "It starts again with the current configuration." if op == "restart" \
            else "It stays stopped until you start it."
        answer = QMessageBox.question(
            self, f"{op.capitalize()} {worker.name}?",
            f"{op.capitalize()} the {worker.role} worker {worker.name}?\n\n{fate}\n{after}",
            QMessageBox.Yes | QMessageBox.No, QMessageBox.No)
        return answer == QMessageBox.Yes
