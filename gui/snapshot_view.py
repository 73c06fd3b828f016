"""SnapshotMixin: the main window's incident-snapshot commands.

Export (File → Export Incident Snapshot…, an alert's context menu) collects and writes a
bundle off the GUI thread; Open shows a bundle read-only in the same window, under a
banner, with every control off; Close (or attaching) returns to a live engine.
"""

from __future__ import annotations

import time

from PySide6.QtWidgets import QFileDialog, QMessageBox, QProgressDialog

from gui.model.snapshot_state import state_from_snapshot
from gui.model.source import Kind
from gui.snapshot.bundle import SnapshotError, read_bundle
from gui.snapshot_export import ExportJob
from gui.transport import TransportClient

SNAPSHOT_MARGIN_S = 60.0  # an alert's snapshot starts this long before the alert


class SnapshotMixin:
    def export_snapshot(self, path: str | None = None, since: float | None = None) -> bool:
        """Collect and write a bundle in the background (progress shown); False if not started."""
        if not self.source.now.live or self.export_job is not None:  # a live engine shown, no export in hand
            return False
        if path is None:
            default = f"pagewarden-snapshot-{time.strftime('%Y%m%d-%H%M%S')}.zip"
            path, _ = QFileDialog.getSaveFileName(self, "Export incident snapshot", default, "Snapshot (*.zip)")
            if not path:
                return False
        job = ExportJob(TransportClient(self.source.transport), path, since=since, endpoint=self.source.now.label,
                        parent=self)
        progress = QProgressDialog("Exporting incident snapshot…", "Cancel", 0, 100, self)
        progress.setWindowTitle("Incident snapshot")
        progress.setMinimumDuration(300)  # short exports never flash a dialog
        progress.setAutoClose(True)
        progress.setAutoReset(False)  # so that 100% does not read as a click on Cancel
        progress.canceled.connect(job.cancel)
        job.progress.connect(lambda f, what: (progress.setValue(int(100 * f)), progress.setLabelText(
            f"Exporting incident snapshot: {what}…")))
        job.succeeded.connect(self._export_done)
        job.failed.connect(self._export_failed)
        job.cancelled.connect(lambda: self.show_message(
            f"Snapshot export cancelled; nothing was written to {path}", 15_000, "warning"))
        job.finished.connect(lambda: (progress.reset(), setattr(self, "export_job", None)))
        self.export_job, self.export_progress = job, progress
        job.start()
        return True

    def export_alert_snapshot(self, alert_id: str) -> None:
        alert = self.state.alerts.get(alert_id)
        since = alert.first_seen - SNAPSHOT_MARGIN_S if alert is not None else None
        self.export_snapshot(since=since)

    def _export_done(self, path: str, summary: dict) -> None:
        self.last_export = path
        self.show_message(f"Snapshot written to {path}: {summary['requests']} requests, "
                          f"{summary['alerts']} alerts, {summary['affected']} responses affected", 20_000, "ok")

    def _export_failed(self, message: str) -> None:
        self.last_export = None
        self.show_message(f"Snapshot export failed: {message}", 20_000, "danger")
        QMessageBox.warning(self, "Incident snapshot", f"The snapshot could not be exported.\n\n{message}")

    def open_snapshot(self, path: str | None = None) -> bool:
        """Show a bundle read-only in this window. A bundle that cannot be read is refused
        with the reason; one that does not verify is shown under a warning."""
        if path is None:
            path, _ = QFileDialog.getOpenFileName(self, "Open incident snapshot", "", "Snapshot (*.zip)")
            if not path:
                return False
        try:
            opened = read_bundle(path)
        except SnapshotError as exc:
            self.snapshot_error = str(exc)
            QMessageBox.critical(self, "Open snapshot", f"This snapshot cannot be opened.\n\n{exc}")
            return False
        state, problems = state_from_snapshot(opened)
        opened.warnings.extend(problems)
        self.toggle_demo(False)
        # the live session goes on behind the snapshot (history, plots, acknowledgements),
        # so that Close returns to it as it was, with what happened meanwhile
        self.source.open_snapshot(opened, shown=self.state)
        self.state = self._fresh_state(state)
        self.snapshot_banner.show_snapshot(opened.manifest, str(opened.path), opened.warnings)
        self.alert_detail.show_alert(None)
        self.state.take_new_alerts()
        self.refresh()
        self.update_title()
        return True

    def close_snapshot(self) -> None:
        """Back to the live session shown before the snapshot was opened, as it was (history,
        plots, acknowledgements) and with what its engine sent meanwhile; no trace of the
        snapshot beside live alerts. Without one, back to no engine."""
        if self.source.now.kind is not Kind.SNAPSHOT:
            return
        live = self.source.close_snapshot()
        self.alert_detail.show_alert(None)
        self.state = self._fresh_state(live)
        self.refresh()
