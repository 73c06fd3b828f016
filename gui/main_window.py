"""MainWindow: composes the views over one EngineState and routes commands to the engine.

Data flows one way: transport -> EngineState -> widgets. Each view follows the state's
events it shows (see gui/widgets/state_view.py); the window's 10 Hz timer flushes them, so
views repaint from the latest state, never once per message, and the window names no view
in its refresh; a view class that declares a Dock is placed without being named here.
Commands flow the other way: widget signal -> request -> the engine; each answer goes to
the callback its request named. What the window shows (a live engine, a snapshot, KV
events) is `self.source` (gui/source.py): the title, the status line, the enabled actions
and the read-only rules are recomputed from it on every change (`_show_source`).
"""

from __future__ import annotations

import time

from PySide6.QtCore import QObject, QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import (
    QApplication,
    QDockWidget,
    QLineEdit,
    QMainWindow,
    QSplitter,
    QTabWidget,
    QToolBar,
    QVBoxLayout,
    QWidget,
)

from engine.client import __version__
from gui.demo_load import DemoLoad
from gui.dialogs.about_dialog import AboutDialog
from gui.dialogs.attach_dialog import AttachDialog
from gui.dialogs.reconfigure_dialog import ReconfigureDialog
from gui.fleet_view import FleetNavigator
from gui.kv_event_view import KvEventMixin
from gui.model.engine_state import EngineState
from gui.model.snapshot_state import scope_pairs
from gui.model.source import Kind, Source
from gui.probe_view import ProbeMixin
from gui.snapshot_view import SnapshotMixin
from gui.source import WindowSource
from gui.theme import apply_theme
from gui.widgets.alert_detail import AlertDetail
from gui.widgets.alerts_badge import AlertsTabBadge
from gui.widgets.alerts_table import AlertsTable
from gui.widgets.capacity_banner import CapacityBanner
from gui.widgets.crossing_banner import CrossingBanner
from gui.widgets.faults_banner import FaultsBanner
from gui.widgets.history_bar import HistoryBar
from gui.widgets.message_area import MessageArea
from gui.widgets.metrics_plots import MetricsPlots
from gui.widgets.notifier import Notifier
from gui.widgets.page_map import PageMapWidget
from gui.widgets.request_timeline import RequestTimeline
from gui.widgets.requests_table import RequestsTable
from gui.widgets.snapshot_banner import SnapshotBanner
from gui.widgets.state_view import StateView, docked_view_classes
from gui.widgets.status_line import StatusLine
from gui.widgets.toast import Toast
from gui.widgets.workers_panel import WorkersPanel

REFRESH_MS = 100  # 10 Hz at most
MAP_MIN_WIDTH, MAP_MIN_HEIGHT = 560, 240  # px: two pools side by side stay readable at 1024x700
KEYFRAME_RETRY_S = 1.0
RECENT_KEY = "recent_engines"
DOCK_AREAS = {"left": Qt.DockWidgetArea.LeftDockWidgetArea, "right": Qt.DockWidgetArea.RightDockWidgetArea,
              "bottom": Qt.DockWidgetArea.BottomDockWidgetArea}
SHORTCUTS = {
    "Attach to an engine": "Ctrl+O", "Export incident snapshot": "Ctrl+E", "Demo load on/off": "Ctrl+D",
    "Reconfigure": "Ctrl+R", "Refresh page maps (keyframe)": "F5", "Colour by request / tenant / state": "1 / 2 / 3",
    "Start / stop / restart the selected worker": "Ctrl+Shift+S / Ctrl+Shift+X / Ctrl+Shift+R",
    "Acknowledge selected alerts": "Ctrl+K", "Fire a canary request": "Ctrl+Shift+C",
    "Open snapshot": "Ctrl+Shift+O", "Back to the Fleet view": "Alt+Left", "Quit": "Ctrl+Q",
}


def _table_and_detail(table: QWidget, detail: QWidget) -> QSplitter:
    """A table with the detail of its selected row beside it (3 : 2)."""
    split = QSplitter(Qt.Orientation.Horizontal)
    split.addWidget(table)
    split.addWidget(detail)
    split.setStretchFactor(0, 3)
    split.setStretchFactor(1, 2)
    return split


class MainWindow(ProbeMixin, KvEventMixin, SnapshotMixin, QMainWindow):
    attach_requested = Signal(dict)  # from File -> Attach...: endpoint, key files, readonly
    kv_attach_requested = Signal(object)  # from File -> Attach to vLLM / SGLang events...: a KvAttach

    def __init__(self, *, readonly: bool = False, theme: str = "system"):
        super().__init__()
        self.state = EngineState()
        self.readonly = readonly  # the user's choice (--readonly, the attach dialog); see effective_readonly
        self.source = WindowSource(self)  # what the window shows, and the threads that show it
        self.demo: DemoLoad | None = None
        self._scope_asks = 0  # only the latest scope ask's answer is shown
        self._last_keyframe_ask = 0.0
        self.export_job = None
        self.last_export: str | None = None
        self.setWindowTitle("PageWarden")
        self.resize(1400, 900)
        self._timer = QTimer(self)
        self._timer.timeout.connect(self.refresh)
        self._demo_timer = QTimer(self)
        self._demo_timer.timeout.connect(self._feed_demo)
        self._build_views()
        self._build_actions()
        self._place_docked_views()
        self._init_kv_events()
        self._init_probe()
        self.source.changed.connect(self._show_source)
        self.source.telemetry.connect(self.on_telemetry)
        self.source.status.connect(self.on_status)
        self.source.stream_event.connect(self.on_stream_event)
        self.source.unanswered_error.connect(
            lambda op, error: self.show_message(f"{op} failed: {error.get('message')}", 15_000, "danger"))
        self.set_theme(theme)
        self._show_source(self.source.now, self.source.now)  # nothing shown yet: the rules for that
        self._timer.start(REFRESH_MS)

    # ---- layout -------------------------------------------------------------------------
    def _build_views(self) -> None:
        state = self.state
        self.banner = CapacityBanner(state)
        self.crossing_banner = CrossingBanner(state)
        self.faults_banner = FaultsBanner(state)
        self.page_map = PageMapWidget(state)
        # the maps are the window's reason to be: the docks give way before they shrink below this
        self.page_map.setMinimumSize(MAP_MIN_WIDTH, MAP_MIN_HEIGHT)
        self.history_bar = HistoryBar(state)
        self.history_bar.frame_chosen.connect(self.page_map.show_frame)
        central = QWidget()
        layout = QVBoxLayout(central)
        layout.setContentsMargins(4, 4, 4, 4)
        self.snapshot_banner = SnapshotBanner()
        self.snapshot_banner.close_requested.connect(self.close_snapshot)
        layout.addWidget(self.snapshot_banner)
        layout.addWidget(self.crossing_banner)
        layout.addWidget(self.banner)
        layout.addWidget(self.faults_banner)
        layout.addWidget(self.page_map, 1)
        layout.addWidget(self.history_bar)
        self.setCentralWidget(central)
        self.requests_table = RequestsTable(state)
        self.alerts_table = AlertsTable(state)
        self.workers_panel = WorkersPanel(state)
        self.metrics = MetricsPlots(state)
        self.alert_detail = AlertDetail(state)
        self.request_timeline = RequestTimeline(state)
        self.requests_table.model.colour_of = lambda row: self.page_map.swatch_of(row.slot)
        bottom = QTabWidget()
        bottom.addTab(_table_and_detail(self.requests_table, self.request_timeline), "Requests")
        alerts_index = bottom.addTab(_table_and_detail(self.alerts_table, self.alert_detail), "Alerts")
        self.bottom_tabs = bottom
        self.alerts_badge = AlertsTabBadge(state, bottom, alerts_index)
        self.notifier = Notifier(state, self)
        self._dock("Requests and alerts", bottom, Qt.DockWidgetArea.BottomDockWidgetArea)
        self._dock("Workers", self.workers_panel, Qt.DockWidgetArea.RightDockWidgetArea)
        self._dock("Metrics", self.metrics, Qt.DockWidgetArea.RightDockWidgetArea)
        self.status_line = StatusLine(state)
        self.message_area = MessageArea()
        self.statusBar().addPermanentWidget(self.message_area, 1)
        self.statusBar().addPermanentWidget(self.status_line, 0)
        # anything that still asks the status bar itself shows in the message area
        self.statusBar().messageChanged.connect(lambda text: text and self._from_status_bar(text))
        self.toast = Toast(self, state=state)
        # selection needs no wiring: every view follows state.selection
        self.workers_panel.command_requested.connect(self.worker_command)
        self.workers_panel.reconfigure_requested.connect(self.open_reconfigure)
        self.banner.reconfigure_requested.connect(self.open_reconfigure)
        self.alerts_table.acknowledge_requested.connect(self.acknowledge_alerts)
        self.alerts_table.view.selectionModel().selectionChanged.connect(self._alert_selected)
        self.alert_detail.scope_requested.connect(self._ask_scope)
        self.alert_detail.request_clicked.connect(self.select_request)
        self.alerts_table.snapshot_requested.connect(self.export_alert_snapshot)

    def show_message(self, text: str, timeout_ms: int = 10_000, tone: str = "info") -> None:
        """A short message in the status bar's message area (never covered by the status line)."""
        self.message_area.show_message(text, timeout_ms, tone)

    def _from_status_bar(self, text: str) -> None:
        self.statusBar().clearMessage()  # shown once, by the message area
        self.show_message(text)

    def _dock(self, title: str, widget: QWidget, area) -> QDockWidget:
        dock = QDockWidget(title, self)
        dock.setObjectName(title)
        dock.setWidget(widget)
        dock.setFeatures(QDockWidget.DockWidgetFeature.DockWidgetMovable | QDockWidget.DockWidgetFeature.DockWidgetFloatable)
        self.addDockWidget(area, dock)
        return dock

    def _place_docked_views(self) -> None:
        """One of every view class that declares a Dock (gui/widgets/state_view.py), tabbed
        with the docks already in its area, and a View menu entry that shows or hides it."""
        self.docked_views: dict[type, QDockWidget] = {}
        self.docked_view_actions: list[QAction] = []
        self.docked_shortcuts: dict[str, str] = {}
        for cls in docked_view_classes():
            declared, area = cls.dock, DOCK_AREAS[cls.dock.area]
            beside = [d for d in self.findChildren(QDockWidget) if self.dockWidgetArea(d) == area]
            dock = self._dock(declared.title, cls(self.state), area)
            dock.setFeatures(dock.features() | QDockWidget.DockWidgetFeature.DockWidgetClosable)
            if beside:
                self.tabifyDockWidget(beside[-1], dock)
            dock.setVisible(declared.shown)
            action = dock.toggleViewAction()
            action.triggered.connect(lambda shown, d=dock: shown and d.raise_())  # in front of its tab group
            if declared.shortcut:
                action.setShortcut(QKeySequence(declared.shortcut))
                self.docked_shortcuts[f"Show / hide {declared.title}"] = declared.shortcut
            self.view_menu.addAction(action)
            self.addAction(action)  # its shortcut works wherever the focus is
            self.docked_views[cls] = dock
            self.docked_view_actions.append(action)

    def _action(self, menu, text: str, slot, shortcut: str | None = None, *, control: bool = False,
                checkable: bool = False) -> QAction:
        action = QAction(text, self)
        if shortcut:
            action.setShortcut(QKeySequence(shortcut))
        action.setCheckable(checkable)
        action.triggered.connect(slot)
        action.setProperty("control", control)  # control actions are off in readonly mode
        menu.addAction(action)
        self.addAction(action)  # shortcuts work wherever the focus is
        return action

    def _build_actions(self) -> None:
        bar = self.menuBar()
        file = bar.addMenu("&File")
        self.attach_action = self._action(file, "&Attach to engine…", self.open_attach, "Ctrl+O")
        self.recent_menu = file.addMenu("Recent engines")
        self.kv_attach_action = self._action(file, "Attach to &vLLM / SGLang events…", self.open_kv_attach)
        # the Fleet view: a navigation aid; the engine attached from it is the source
        self.fleet = FleetNavigator(self)
        self.fleet_action = self._action(file, "&Fleet…", self.fleet.open_dialog)
        self.back_action = self._action(file, "&Back to the Fleet", self.fleet.back, "Alt+Left")
        self.back_action.setToolTip("Back to the Fleet view (Alt+Left)")
        self.export_action = self._action(file, "&Export Incident Snapshot…", lambda: self.export_snapshot(),
                                          "Ctrl+E")
        self.open_snapshot_action = self._action(file, "&Open Snapshot…", lambda: self.open_snapshot(),
                                                 "Ctrl+Shift+O")
        file.addSeparator()
        self._action(file, "&Quit", self.close, "Ctrl+Q")
        engine = self.engine_menu = bar.addMenu("&Engine")
        self.demo_action = self._action(engine, "&Demo load", self.toggle_demo, "Ctrl+D", control=True,
                                        checkable=True)
        self.reconfigure_action = self._action(engine, "&Reconfigure…", self.open_reconfigure, "Ctrl+R", control=True)
        self._action(engine, "Refresh page maps (keyframe)", self.ask_keyframe, "F5")
        engine.addSeparator()
        self.worker_actions = {
            op: self._action(engine, f"{op.capitalize()} selected worker", lambda _=False, op=op: self._selected_worker(op),
                             key, control=True)
            for op, key in (("start", "Ctrl+Shift+S"), ("stop", "Ctrl+Shift+X"), ("restart", "Ctrl+Shift+R"))
        }
        self.ack_action = self._action(engine, "Acknowledge selected alerts", self.alerts_table.acknowledge_selected,
                                       "Ctrl+K", control=True)
        self.canary_action = self._action(engine, "Fire a &canary", lambda: self.request("canary"),
                                          "Ctrl+Shift+C", control=True)
        view = self.view_menu = bar.addMenu("&View")
        modes = QActionGroup(self)
        self.color_mode_actions = []
        for i, (mode, text) in enumerate((("request", "Colour by &request"), ("tenant", "Colour by &tenant"),
                                          ("state", "Colour by &state")), start=1):
            action = self._action(view, text, lambda _=False, m=mode: self.page_map.set_color_mode(m), str(i),
                                  checkable=True)
            action.setChecked(mode == "request")
            modes.addAction(action)
            self.color_mode_actions.append(action)
        view.addSeparator()
        themes = QActionGroup(self)
        for mode in ("system", "dark", "light"):
            action = self._action(view, f"{mode.capitalize()} theme", lambda _=False, m=mode: self.set_theme(m),
                                  checkable=True)
            themes.addAction(action)
            action.setChecked(mode == "system")
        self._build_probe_menu(bar)
        help_menu = bar.addMenu("&Help")
        self._action(help_menu, "&About PageWarden", self.show_about, "F1")
        toolbar = QToolBar("Main")
        toolbar.setObjectName("main-toolbar")
        for action in (self.back_action, self.attach_action, self.demo_action, self.reconfigure_action):
            toolbar.addAction(action)
        toolbar.addSeparator()
        self.find_box = QLineEdit()
        self.find_box.setPlaceholderText("Find request or tenant (Ctrl+F)")
        self.find_box.setToolTip("Shows only matching requests and alerts, and veils other pages in the maps.\n"
                                 "acme: ids or tenants containing it · tenant:acme · request:r12: exactly")
        self.find_box.setClearButtonEnabled(True)
        self.find_box.setMaximumWidth(280)
        self.find_box.textChanged.connect(lambda text: self.state.set_find(text))
        toolbar.addWidget(self.find_box)
        view.addSeparator()
        self._action(view, "&Find request or tenant",
                     lambda _=False: (self.find_box.setFocus(), self.find_box.selectAll()), "Ctrl+F")
        view.addSeparator()  # the docked views' entries follow (_place_docked_views)
        self.addToolBar(toolbar)
        self._fill_recent()

    # ---- the source: what the window shows ------------------------------------------------
    def attach(self, transport, endpoint: str, *, hosted: bool = False) -> None:
        """Start showing the engine behind `transport` (a TransportThread, not yet started)."""
        if self.source.now.kind not in (Kind.NONE, Kind.KV_EVENTS):  # a window with nothing shown keeps its state
            self.state = self._fresh_state()
        self.source.open_live(transport, endpoint, hosted=hosted)
        if not hosted:
            self._remember(endpoint)

    def _show_source(self, before: Source, after: Source) -> None:
        """Everything that follows from the source, recomputed on every change of it."""
        if before.shows_engine_views != after.shows_engine_views:
            self._show_kv_mode(not after.shows_engine_views)
        if after.kind is not Kind.SNAPSHOT:
            self.snapshot_banner.hide()
        self.status_line.set_endpoint(after.address())
        self.status_line.set_connection(after.link_words())
        self.status_line.set_snapshot(after.taken if after.kind is Kind.SNAPSHOT else None)
        self.workers_panel.set_connected(after.connected)
        self.state.events.connection.mark()
        self._show_readonly()
        if after.connected and not before.connected:
            self.ask_keyframe()

    def _fresh_state(self, state: EngineState | None = None) -> EngineState:
        """A new engine (or a snapshot): a new state object for every view, each repainted
        from it at the next refresh."""
        state = state or EngineState()
        state.set_find(self.find_box.text())  # the find box stays as typed across engines
        for view in self.state_views():
            view.state = state
        state.events.mark_all()
        return state

    def state_views(self) -> list[StateView]:
        """Every view in this window that shows the EngineState."""
        return [child for child in self.findChildren(QObject)
                if isinstance(child, StateView) and child.shows_window_state]

    @property
    def engine_state(self) -> EngineState:
        """The state the engine's telemetry goes to: the window's, or the live one behind a snapshot."""
        return self.source.live_state if self.source.live_state is not None else self.state

    def on_telemetry(self, messages: list) -> None:
        state = self.engine_state
        for msg in messages:
            state.apply(msg)  # marks what changed; views repaint at the next refresh

    def on_status(self, status: dict) -> None:
        state = self.engine_state
        state.apply_status(status)
        self.source.set_engine_read_only(state.engine.get("read_only") is True)
        self.update_title()  # the engine's name may have changed with it
        if not state.current_alerts() and status.get("alerts"):
            from engine.wire.protocol import Message

            for record in status["alerts"]:
                state.apply(Message({"topic": "alerts", **record}))

    def _worker_answered(self, op: str, result, error) -> None:
        if error:
            self.show_message(f"{op} failed: {error.get('message')}", 15_000, "danger")
        else:
            self.show_message(f"{op} {result.get('name')}: {result.get('state')}", 8_000, "ok")

    def on_stream_event(self, msg) -> None:  # a submit's stream: msg.op is the stream's step, not a reply's op
        if self.demo is not None and msg.op in ("done", "error"):
            self.demo.ended(msg.get("id"))

    # ---- the 10 Hz repaint ------------------------------------------------------------
    def refresh(self) -> None:
        """The frame: every view whose events were marked since the last one repaints once."""
        self._refresh_probe()
        source = self.source.now
        if source.kind is Kind.KV_EVENTS:
            self._refresh_kv()
            self._update_enablement()
            return
        stale = self.state.check_stale(connected=source.connected, live=source.kind is not Kind.SNAPSHOT)
        dialog = getattr(self, "reconfigure_dialog", None)
        if dialog is not None and dialog.isVisible():
            dialog.set_stale(stale)
        live = self.engine_state if self.source.transport is not None else None
        if live is not None:
            live.record_history()  # behind a snapshot too: Close returns to an unbroken history
        self.state.events.frame.mark()
        self.state.events.flush()
        self._update_enablement()
        self.update_title()
        if (live is not None and live.pages.stale_pools()
                and time.monotonic() - self._last_keyframe_ask > KEYFRAME_RETRY_S):
            self.ask_keyframe()  # a sequence gap: resynchronise

    def _update_enablement(self) -> None:
        """The actions' enabled states: a function of the source, the user's choice and an export in hand."""
        source = self.source.now
        controls = source.controls_enabled(self.readonly)
        for action in self.actions():
            if action.property("control"):
                action.setEnabled(controls)
        self.export_action.setEnabled(source.export_enabled(exporting=self.export_job is not None))
        self.back_action.setEnabled(self.fleet.view is not None)

    # ---- commands -----------------------------------------------------------------------
    def request(self, op: str, on_answer=None, **fields) -> int | None:
        """Send a command through the transport; refused (None) in readonly mode or offline.
        on_answer(result, error) gets its answer (error: the error map, or None); without one
        an error is shown on the status line."""
        if not self.source.now.allows(op, user_readonly=self.readonly):
            return None  # behind a snapshot the engine is only listened to
        return self.source.request(op, on_answer, **fields)

    def ask_keyframe(self) -> None:
        self._last_keyframe_ask = time.monotonic()
        self.request("keyframe")

    def worker_command(self, op: str, worker: str) -> None:
        self.request(op, lambda result, error: self._worker_answered(op, result, error), worker=worker)

    def _selected_worker(self, op: str) -> None:
        worker = self.workers_panel.selected_worker()
        if worker:
            self.workers_panel.ask(op, worker)

    def _alert_selected(self, *_) -> None:
        rows = self.alerts_table.selected_rows()
        if len(rows) == 1:  # a refresh that drops the selection keeps the detail on screen
            self.alert_detail.show_alert(rows[0])

    def _ask_scope(self, since: float, until: float, run: str = "") -> None:
        if self.source.snapshot is not None:  # answered from the bundle
            self.alert_detail.show_scope(scope_pairs(self.source.snapshot, since, until))
            return
        self._scope_asks += 1
        ask = self._scope_asks

        def answered(result, error) -> None:
            if ask == self._scope_asks:  # a newer ask supersedes this one
                self.alert_detail.show_scope([] if error else result.get("pairs", []))

        self.request("scope", answered, since=since, until=until, **({"run": run} if run else {}))

    def select_request(self, request_id: str) -> None:
        """Select a request everywhere: the page maps highlight it, the table shows it."""
        self.state.select_request(request_id)

    def acknowledge_alerts(self, ids: list) -> None:
        alerts = self.state.alerts
        ids = [i for i in ids if i not in alerts or alerts[i].ackable]  # a gone engine's alerts: nobody to ask
        ids = self.acknowledge_probe_alerts(ids)
        if ids:  # the engine names an episode by its key
            self.request("ack_alert", ids=[alerts[i].ack_id if i in alerts else i for i in ids])

    def open_reconfigure(self) -> None:
        if not self.source.now.allows("reconfigure", user_readonly=self.readonly):
            return
        dialog = ReconfigureDialog(self.state, self)
        dialog.validate_requested.connect(lambda changes: self._reconfigure(changes, False))
        dialog.apply_requested.connect(lambda changes: self._reconfigure(changes, True))
        self.reconfigure_dialog = dialog
        dialog.open()

    def _reconfigure(self, changes: dict, apply: bool) -> None:
        def answered(result, error) -> None:
            dialog = getattr(self, "reconfigure_dialog", None)
            if dialog is not None:
                dialog.show_error(error["message"]) if error else dialog.show_result(result)
                if apply and not error:
                    dialog.accept()

        self.request("reconfigure", answered, changes=changes, apply=apply)

    def toggle_demo(self, on: bool) -> None:
        if on and self.source.now.demo_allowed(self.readonly):
            window = int(self.state.config.get("engine", {}).get("context_window", 2048))
            self.demo = DemoLoad(context_window=window)
            self._demo_timer.start(200)
        else:
            self._demo_timer.stop()
            self.demo = None
        self.demo_action.setChecked(self.demo is not None)

    def _demo_started(self, demo, result) -> None:
        if demo is self.demo:  # a demo turned off since: its answers are nobody's
            demo.started(result["stream"])

    def _feed_demo(self) -> None:
        demo = self.demo
        if demo is None or not self.source.now.connected:
            return
        for _ in range(4):
            if not demo.want_more() or len(demo.inflight) + demo.sent - demo.finished > demo.max_inflight * 2:
                break
            self.request("submit", lambda result, error, d=demo: self._demo_started(d, result), **demo.next_request())

    # ---- attach dialog, recent engines, theme, readonly, about --------------------------
    def open_attach(self) -> None:
        dialog = AttachDialog(self._recent(), self)
        if dialog.exec():
            self.attach_requested.emit(dialog.result_values())

    def _recent(self) -> list[str]:
        value = QSettings().value(RECENT_KEY, [])
        return [value] if isinstance(value, str) else list(value or [])

    def _remember(self, endpoint: str) -> None:
        recent = [endpoint, *[e for e in self._recent() if e != endpoint]][:10]
        QSettings().setValue(RECENT_KEY, recent)
        self._fill_recent()

    def _fill_recent(self) -> None:
        self.recent_menu.clear()
        for endpoint in self._recent():
            action = self.recent_menu.addAction(endpoint)
            action.triggered.connect(lambda _=False, e=endpoint: self.attach_requested.emit({"endpoint": e}))
        self.recent_menu.setEnabled(bool(self._recent()))

    def set_theme(self, mode: str) -> None:
        self.theme = apply_theme(QApplication.instance(), mode)
        self.page_map.set_theme(self.theme)
        if self.kv_view is not None:
            self.kv_view.set_theme(self.theme)
        self.metrics.set_theme(self.theme)

    @property
    def engine_readonly(self) -> bool:
        """The engine shown says it answers viewer ops only (`read_only: true` in its status's
        engine map: the PageWarden agent for vLLM); it ends with that engine."""
        return self.source.now.kind is Kind.VLLM_AGENT

    @property
    def effective_readonly(self) -> bool:
        """What the window does: read-only when the user chose it or the engine is read-only."""
        return self.source.now.read_only(self.readonly)

    def set_readonly(self, readonly: bool) -> None:
        """The user's choice (--readonly, the attach dialog); a read-only engine overrides
        it while attached, and the choice is back once the window leaves that engine."""
        self.readonly = readonly
        self._show_readonly()

    def _show_readonly(self) -> None:
        source = self.source.now
        for view in (self.workers_panel, self.alerts_table, self.banner):
            view.set_readonly(source.views_read_only(self.readonly))
        if not source.demo_allowed(self.readonly):
            self.toggle_demo(False)
        self._update_enablement()
        self.status_line.set_readonly(source.read_only(self.readonly), source.read_only_reason())
        self.update_title()

    def update_title(self) -> None:
        """The source, whether it is read-only and its firing critical alerts (every frame)."""
        engine = self.state.engine
        title = self.source.now.title(user_readonly=self.readonly, engine_name=engine.get("name"),
                                      hostname=engine.get("hostname"), critical=self.state.firing_critical())
        if title != self.windowTitle():
            self.setWindowTitle(title)

    def show_about(self) -> None:
        AboutDialog(__version__, {**SHORTCUTS, **self.docked_shortcuts}, self).exec()

    def closeEvent(self, event) -> None:
        self._timer.stop()
        self._demo_timer.stop()
        self.close_probe()
        self.fleet.close()
        self.source.close()
        super().closeEvent(event)

