"""KvEventMixin: the main window's KV-event mode, attached to vLLM / SGLang KV-event streams
instead of a PageWarden engine.

A KvEventThread owns the watcher's sockets and applies what arrives to a
SharedKvEventState; the window's 10 Hz refresh rebuilds the Qt-free KvEventMap from it,
under its lock, when a batch arrived. The engine's own views (workers, requests, alerts,
metrics) and every action only our engine supports are hidden while the mode lasts;
attaching to an engine or opening a snapshot leaves it.

A gap is filled by a replay inside the watcher's poll(), on that thread: a replay endpoint
that does not answer holds the thread (up to the watcher's 2 s replay timeout), never the
window.
"""

from __future__ import annotations

from PySide6.QtWidgets import QDockWidget, QLabel

from engine.adapters.kv_attach import KvAttach
from gui.dialogs.kv_attach_dialog import KvAttachDialog
from gui.model.kv_event_map import KvEventMap
from gui.model.source import Kind
from gui.widgets.kv_event_map import KvEventMapWidget


class KvEventMixin:
    def _init_kv_events(self) -> None:
        self.kv_map: KvEventMap | None = None
        self.kv_view: KvEventMapWidget | None = None  # built on the first attach
        self._kv_hidden_docks: list[QDockWidget] = []
        self.kv_status = QLabel()
        self.kv_status.hide()
        self.statusBar().addPermanentWidget(self.kv_status, 1)
        self.source.kv_failed.connect(lambda message: self.show_message(message, 15_000, "danger"))

    def open_kv_attach(self) -> None:
        """File → Attach to vLLM / SGLang events…: the dialog, then kv_attach_requested."""
        dialog = KvAttachDialog(self)
        if dialog.exec():
            self.kv_attach_requested.emit(dialog.values())

    def attach_kv_events(self, attach: KvAttach) -> None:
        """Watch `attach`'s endpoints in place of any engine or snapshot. Raises KvEventError
        (naming the address) when the watcher cannot be made; nothing changes then."""
        self.source.open_kv_events(attach)  # raises before anything changed; the mode shows (_show_kv_mode)
        self.kv_map = self.kv_view.state = KvEventMap()  # a new stream, a new map
        self.state = self._fresh_state()
        self.refresh()

    def leave_kv_events(self) -> None:
        """Stop watching and bring the engine's views back (no-op outside KV-event mode)."""
        if self.source.now.kind is Kind.KV_EVENTS:
            self.source.close()

    def _refresh_kv(self) -> None:
        source = self.source
        state, endpoints = source.kv_thread.watcher.state, list(source.kv_attach.endpoints)
        with state.lock:  # the KV-event thread applies batches under it
            changed = self.kv_map.update(state)
            text = self.kv_map.status_text(state, endpoints)
            details = self.kv_map.health_details(state, endpoints)
        if changed:
            self.kv_view.refresh()
        self.kv_status.setText(text)
        self.kv_status.setToolTip(details)

    def _show_kv_mode(self, on: bool) -> None:
        """The engine's views, menu and actions out of the way while KV events are shown, and back."""
        if on and self.kv_view is None:  # built on the first attach
            self.kv_view = KvEventMapWidget(KvEventMap(), theme_name=self.theme)
            self.centralWidget().layout().addWidget(self.kv_view, 1)
        self.page_map.setVisible(not on)
        if on:
            self.banner.hide()
            self._kv_hidden_docks = [d for d in self.findChildren(QDockWidget) if not d.isHidden()]
        for dock in self._kv_hidden_docks:
            dock.setVisible(not on)
        self.kv_view.setVisible(on)
        self.engine_menu.menuAction().setVisible(not on)
        engine_only = [a for a in self.actions() if a.property("control")]
        for action in (*engine_only, self.export_action, *self.color_mode_actions, *self.docked_view_actions):
            action.setVisible(not on)
        self.status_line.setVisible(not on)
        self.kv_status.setVisible(on)
