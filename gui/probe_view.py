"""ProbeMixin: the main window's Tools → Probe an OpenAI endpoint…, in every mode.

A QTimer asks the Qt-free ProbeSchedule whether a run is due; a run (blocking HTTP) goes
to the window's one ProbeRunner thread, which runs them one at a time and hands each round
(or the cache_salt check's report, which the dialog also shows) back through a ProbeRelay's
queued signals. The
schedule turns rounds and errors into local alerts, which the window keeps in
`probe_alerts` and folds into whatever EngineState it shows (a new engine's state gets
them again). In KV-event mode, where the engine's docks are hidden, the alerts dock
comes back once the probe has something to show.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import replace

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtWidgets import QDockWidget, QLabel

from engine.adapters.leak_probe import open_probe
from engine.adapters.openai_http import ProbeError
from engine.adapters.salt_check import open_salt_check
from gui.dialogs.probe_dialog import ProbeDialog
from gui.model.engine_state import AlertRow
from gui.model.probe_schedule import ALERT_PREFIX, ProbeRequest, ProbeSchedule
from gui.model.source import Kind

TICK_MS = 1000
HTTP_TIMEOUT_S = 120.0


class ProbeRelay(QObject):
    """Signals from the probe's thread to the GUI thread (queued: emitted off the GUI thread)."""

    round_done = Signal(object, object, object)  # schedule, RoundReport, {round: marker}
    failed = Signal(object, str)  # schedule, message
    salt_done = Signal(object, object)  # schedule, SaltReport
    run_ended = Signal(object)  # schedule


def run_probe(schedule: ProbeSchedule, stop: threading.Event, relay: ProbeRelay) -> None:
    """One run of `schedule`'s rounds (the probe thread's body); never raises."""
    request = schedule.request
    try:
        if request.salt_check:
            check = open_salt_check(request.url, model=request.model, pairs=request.pairs, timeout_s=HTTP_TIMEOUT_S)
            relay.salt_done.emit(schedule, check.run())
            return
        probe = open_probe(request.url, model=request.model, timeout_s=HTTP_TIMEOUT_S)
        for number in range(1, request.rounds + 1):
            if stop.is_set():
                break
            report = probe.run_round(number)
            relay.round_done.emit(schedule, report, dict(probe.markers))
    except ProbeError as exc:
        relay.failed.emit(schedule, str(exc))
    except Exception as exc:  # a malformed reply must not end the GUI's probe silently
        relay.failed.emit(schedule, f"{type(exc).__name__}: {exc}")
    finally:
        relay.run_ended.emit(schedule)


class ProbeRunner:
    """The one thread that runs a window's probe runs, one at a time, in submission order.

    Daemon: a round blocked in HTTP (up to HTTP_TIMEOUT_S) must not keep the app from
    quitting; close() asks it to end after the run in hand and waits a moment only."""

    def __init__(self, relay: ProbeRelay):
        self.relay = relay
        self._jobs: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None

    def submit(self, schedule: ProbeSchedule, stop: threading.Event) -> None:
        """Queue one run of `schedule` (started by the thread when the previous run ended)."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="leak-probe", daemon=True)
            self._thread.start()
        self._jobs.put((schedule, stop))

    def close(self, wait_s: float = 1.0) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(wait_s)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            run_probe(*job, self.relay)


class ProbeMixin:
    def _build_probe_menu(self, bar) -> None:
        tools = self.tools_menu = bar.addMenu("&Tools")
        self.probe_action = self._action(tools, "&Probe an OpenAI endpoint…", self.open_probe_dialog)
        self.stop_probe_action = self._action(tools, "&Stop the probe", self.stop_probe)
        self.stop_probe_action.setEnabled(False)

    def _init_probe(self) -> None:
        self.probe: ProbeSchedule | None = None
        self.probe_alerts: list[AlertRow] = []  # every probe's, newest last
        self._probe_stop = threading.Event()
        self._probe_state = None  # the EngineState the alerts were folded into
        self._probe_relay = ProbeRelay()
        self._probe_relay.round_done.connect(self._on_probe_round)
        self._probe_relay.failed.connect(self._on_probe_failed)
        self._probe_relay.salt_done.connect(self._on_salt_done)
        self._probe_relay.run_ended.connect(self._on_probe_ended)
        self._probe_runner = ProbeRunner(self._probe_relay)
        self._probe_timer = QTimer(self)
        self._probe_timer.timeout.connect(self._probe_tick)
        self.probe_status = QLabel()
        self.probe_status.setObjectName("probe-status")
        self.probe_status.hide()
        self.statusBar().addPermanentWidget(self.probe_status)

    def open_probe_dialog(self) -> None:
        """Tools → Probe an OpenAI endpoint…: the dialog, then start_probe."""
        self.probe_dialog = dialog = ProbeDialog(self)
        dialog.accepted.connect(lambda: self.start_probe(dialog.values()))
        dialog.salt_requested.connect(self.start_probe)  # the dialog stays open for the verdict
        dialog.open()

    def start_probe(self, request: ProbeRequest) -> None:
        """Probe `request.url` now and then every `every_minutes` (replacing any probe)."""
        self.stop_probe()
        self._probe_stop = threading.Event()
        self.probe = ProbeSchedule(request, time.monotonic())
        self._probe_timer.start(TICK_MS)
        self._probe_tick()

    def close_probe(self) -> None:
        """The window closes: no further run, and the runner's thread ends after the run in hand."""
        self.stop_probe()
        self._probe_runner.close(wait_s=0.5)

    def stop_probe(self) -> None:
        """No further run; the round in flight ends on its own (its results still count)."""
        if self.probe is not None:
            self.probe.stop()
        self._probe_stop.set()
        self._probe_timer.stop()
        self._refresh_probe()

    def _probe_tick(self) -> None:
        schedule = self.probe
        if schedule is None or not schedule.due(time.monotonic()):
            return
        schedule.start_run(time.monotonic())
        self._probe_runner.submit(schedule, self._probe_stop)
        self._refresh_probe()

    def _on_probe_round(self, schedule, report, markers) -> None:
        self._add_probe_alerts(schedule.add_round(report, markers))

    def _on_probe_failed(self, schedule, message: str) -> None:
        self._add_probe_alerts([schedule.add_error(message)])
        self._show_in_dialog(schedule, f"The salt check could not run: {message}")

    def _on_salt_done(self, schedule, report) -> None:
        self._add_probe_alerts(schedule.add_salt_report(report))
        self._show_in_dialog(schedule, "\n".join(report.lines()))

    def _show_in_dialog(self, schedule, text: str) -> None:
        dialog = getattr(self, "probe_dialog", None)
        if schedule.request.salt_check and schedule is self.probe and dialog is not None and dialog.salt_running:
            dialog.show_salt_result(text)

    def _on_probe_ended(self, schedule) -> None:
        schedule.end_run()
        if schedule is self.probe and not schedule.active:
            self._probe_timer.stop()
        self._refresh_probe()

    def _add_probe_alerts(self, rows: list[AlertRow]) -> None:
        self.probe_alerts += rows
        if rows and self.source.now.kind is not Kind.SNAPSHOT:
            for row in rows:
                self.state.alerts[row.id] = row
                self.state.new_alerts.append(row)
            self.state.events.alerts.mark()
            if self.source.now.kind is Kind.KV_EVENTS:  # the window's refresh skips the engine's views there
                self._show_probe_alerts()
        self._refresh_probe()

    def _show_probe_alerts(self) -> None:
        self.alerts_table.refresh()
        self.bottom_tabs.setCurrentIndex(1)
        for dock in self.findChildren(QDockWidget):
            if dock.widget() is self.bottom_tabs:
                dock.show()

    def acknowledge_probe_alerts(self, ids: list) -> list:
        """Acknowledge the local (probe) alerts among `ids`; returns the engine's ones."""
        local = {str(i) for i in ids if str(i).startswith(ALERT_PREFIX)}
        for n, row in enumerate(self.probe_alerts):
            if row.id in local:  # a new object: the table repaints rows that are not the same
                self.probe_alerts[n] = replace(row, acked=True)
                if row.id in self.state.alerts:
                    self.state.alerts[row.id] = self.probe_alerts[n]
        if local:
            self.state.events.alerts.mark()
        return [i for i in ids if str(i) not in local]

    def _refresh_probe(self) -> None:
        """Called by the window's 10 Hz refresh: status text, actions, alerts for a new state."""
        if self.source.now.kind is not Kind.SNAPSHOT and self.state is not self._probe_state:
            self._probe_state = self.state
            missing = [row for row in self.probe_alerts if row.id not in self.state.alerts]
            for row in missing:
                self.state.alerts[row.id] = row
            if missing:
                self.state.events.alerts.mark()
                if self.source.now.kind is Kind.KV_EVENTS:
                    self._show_probe_alerts()
        schedule = self.probe
        self.stop_probe_action.setEnabled(schedule is not None and schedule.active)
        self.probe_status.setVisible(schedule is not None)
        if schedule is not None:
            self.probe_status.setText(schedule.status_text(time.monotonic()))
            self.probe_status.setToolTip(f"{schedule.request.url}"
                                         + (f"\nlast error: {schedule.last_error}" if schedule.last_error else ""))
