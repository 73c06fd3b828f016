"""The Fleet view: every engine a Prometheus knows, one row each, worst first, and a way in.

`FleetView` is a window of its own over the Qt-free `FleetModel` (gui/model/fleet.py). Each
refresh runs `FleetQuery.snapshot()` on a daemon thread (one in flight at most; a slow or dead
Prometheus holds that thread up to its timeout, never the window) and hands the snapshot back
by a queued signal. It refreshes every scrape interval (`global.scrape_interval`, default
15 s) unless told another. Enter or a double-click on a row asks to attach to its control
endpoint (`attach_requested`, the values the attach dialog gives, with the keys remembered by
the Fleet dialog); the main window attaches through the same path as File → Attach.

`FleetNavigator` is the main window's side: File → Fleet…, and Back (Alt+Left) to the view.
The view is a navigation aid: what the window shows stays `MainWindow.source`.
"""

from __future__ import annotations

import threading

from PySide6.QtCore import QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QKeySequence
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from engine.adapters.prometheus_fleet import DEFAULT_SCRAPE_S, FleetQuery, FleetSnapshot
from gui import theme
from gui.dialogs.fleet_dialog import FleetDialog, fleet_keys
from gui.model.fleet import COLUMNS, FleetModel, FleetRow, age_words, count_words, model_words
from gui.widgets.row_table_model import RowTableModel, row_table_view
from gui.widgets.sparkline_delegate import SERIES_ROLE, SparklineDelegate

URGENCY_TONE = {0: "danger", 1: "danger", 2: "warning", 3: "warning", 4: "warning"}
SPARK_COLUMN = COLUMNS.index("Last 10 min")
FINDING_COLUMN = COLUMNS.index("Finding")


def _cells(row: FleetRow) -> tuple[str, ...]:
    e = row.engine
    pools = " ".join(f"{pool} {ratio:.0%}" for pool, ratio in sorted(e.pools.items())) or "–"
    up = {True: "up", False: "DOWN", None: "?"}[e.up]
    age = age_words(e.uptime_s) if e.uptime_s is not None else "–"
    return (e.instance, row.finding, up, e.kind, model_words(e.model), pools, "", str(e.critical_firing),
            count_words(e.cross_reads_5m), f"{count_words(e.restarts_15m)} / {count_words(e.restarts_total)}", age,
            str(e.defences_off),
            str(e.faults_on), e.control or "–")


class FleetTableModel(RowTableModel):
    columns = COLUMNS

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        row: FleetRow = self.rows[index.row()]
        col = index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            return _cells(row)[col]
        if role == SERIES_ROLE and col == SPARK_COLUMN:
            return list(row.engine.usage_history)
        if role == Qt.ItemDataRole.ForegroundRole and col == FINDING_COLUMN and row.urgency in URGENCY_TONE:
            return theme.color(URGENCY_TONE[row.urgency])
        if role == Qt.ItemDataRole.ToolTipRole:
            return f"{row.finding}\ncontrol: {row.engine.control or 'unknown'}\nEnter or double-click: attach"
        if role == Qt.ItemDataRole.BackgroundRole and row.urgency in URGENCY_TONE:
            tone = QColor(theme.color(URGENCY_TONE[row.urgency]))
            tone.setAlpha(40)
            return tone
        return None


class FleetView(QWidget):
    attach_requested = Signal(dict)  # endpoint, server_key, client_keys: as the attach dialog gives
    _answered = Signal(object)  # a FleetSnapshot, from the query thread (queued to this thread)

    def __init__(self, url: str, *, job_regex: str = ".*", refresh_s: float | None = None, timeout_s: float = 10.0,
                 settings: QSettings | None = None, parent=None):
        super().__init__(parent, Qt.WindowType.Window)
        self.setWindowTitle(f"PageWarden — Fleet — {url}")
        self.query = FleetQuery(url, job_regex, timeout_s=timeout_s)
        self.settings = settings if settings is not None else QSettings()
        self.fleet = FleetModel(url)
        self.refresh_s = refresh_s  # None: the scrape interval Prometheus says
        self.inflight = False
        self.closed = False
        self.table_model = FleetTableModel(self)
        widths = (150, 400, 50, 135, 100, 150, 110, 60, 100, 115, 55, 90, 70, 160)
        self.table = row_table_view(self.table_model, widths, len(COLUMNS) - 1)
        self.table.setItemDelegateForColumn(SPARK_COLUMN, SparklineDelegate(self.table))
        self.table.activated.connect(self._activated)  # Enter, and a double-click
        self.status = QLabel()
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.refresh_button = QPushButton("Refresh")
        self.refresh_button.setShortcut(QKeySequence("F5"))
        self.refresh_button.clicked.connect(self.refresh)
        bottom = QHBoxLayout()
        bottom.addWidget(self.status, 1)
        bottom.addWidget(self.refresh_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.addWidget(self.table, 1)
        layout.addLayout(bottom)
        self._answered.connect(self._on_snapshot)
        self.timer = QTimer(self)
        self.timer.timeout.connect(self.refresh)
        self.ticker = QTimer(self)  # the rows' age, while a refresh fails
        self.ticker.timeout.connect(self._show_status)
        self.ticker.start(1000)
        self.resize(1600, 520)
        self._show_status()

    # ---- refreshing off the GUI thread ----------------------------------------------------
    def start(self) -> None:
        """Ask now, then every interval."""
        self.refresh()
        self.timer.start(int((self.refresh_s or DEFAULT_SCRAPE_S) * 1000))

    def refresh(self) -> None:
        """Start one refresh on a thread of its own (nothing when one is in flight)."""
        if self.inflight or self.closed:
            return
        self.inflight = True
        threading.Thread(target=self._ask, args=(self.query,), name="fleet-query", daemon=True).start()

    def _ask(self, query: FleetQuery) -> None:  # on the query thread
        snapshot = query.snapshot()
        try:
            self._answered.emit(snapshot)
        except RuntimeError:  # the view was deleted meanwhile: nobody to tell
            pass

    def _on_snapshot(self, snapshot: FleetSnapshot) -> None:
        self.inflight = False
        if self.closed:
            return
        if self.fleet.update(snapshot):
            self.table_model.update_rows(self.fleet.rows)
        if self.refresh_s is None and snapshot.scrape_interval_s:
            interval = int(max(1.0, snapshot.scrape_interval_s) * 1000)
            if self.timer.interval() != interval:
                self.timer.setInterval(interval)
        self._show_status()

    def _show_status(self) -> None:
        self.status.setText(self.fleet.status_text())
        self.status.setStyleSheet(f"color: {theme.color('danger').name()};" if self.fleet.failing else "")

    # ---- attaching ------------------------------------------------------------------------
    def _activated(self, index) -> None:
        if 0 <= index.row() < len(self.table_model.rows):
            self.attach_row(self.table_model.rows[index.row()])

    def attach_row(self, row: FleetRow) -> None:
        if not row.attachable:
            self.status.setText(f"{row.engine.instance}: no control endpoint known (engine_info never scraped)")
            return
        self.attach_requested.emit({"endpoint": row.engine.control, **fleet_keys(self.settings)})

    def selected_row(self) -> FleetRow | None:
        index = self.table.currentIndex()
        return self.table_model.rows[index.row()] if index.isValid() else None

    def closeEvent(self, event) -> None:
        self.timer.stop()  # a window shown again (Back) starts it again
        super().closeEvent(event)

    def showEvent(self, event) -> None:
        if not self.timer.isActive() and not self.closed:
            self.start()
        super().showEvent(event)

    def stop(self) -> None:
        """For good: no more refreshes; a query in flight ends on its thread and is dropped."""
        self.closed = True
        self.timer.stop()
        self.ticker.stop()


class FleetNavigator:
    """The main window's side: File → Fleet…, Back to the view, attach from a row."""

    def __init__(self, window):
        self.window = window
        self.view: FleetView | None = None

    def open_dialog(self) -> None:
        dialog = FleetDialog(self.window)
        if dialog.exec():
            self.open(**dialog.values())

    def open(self, url: str, *, job_regex: str = ".*", refresh_s: float | None = None,
             timeout_s: float = 10.0) -> FleetView:
        """Show the fleet of the Prometheus at `url` (a view of another one is closed)."""
        if self.view is not None:
            self.view.stop()
            self.view.close()
            self.view.deleteLater()
        self.view = FleetView(url, job_regex=job_regex, refresh_s=refresh_s, timeout_s=timeout_s, parent=self.window)
        self.view.attach_requested.connect(self._attach)
        self.back()
        return self.view

    def _attach(self, values: dict) -> None:
        self.window.attach_requested.emit(values)  # App.attach_from_dialog: the attach dialog's path
        self.window.show()
        self.window.raise_()
        self.window.activateWindow()
        self.window.show_message(f"attached from the fleet to {values['endpoint']} · Back (Alt+Left) returns",
                                 8_000, "info")

    def back(self) -> None:
        """Back to the Fleet view (nothing when none was opened)."""
        if self.view is None:
            return
        self.view.show()
        self.view.raise_()
        self.view.activateWindow()

    def close(self) -> None:
        if self.view is not None:
            self.view.stop()
            self.view.close()
