"""ExportJob: collect and write an incident snapshot off the GUI thread.

It asks the engine through the window's transport (a TransportClient: the transport
thread stays the one owner of the sockets), writes the bundle, and reports progress
through signals. Cancel (the progress dialog's button) stops it at the next step: no
file is left behind, and the window goes on as before.
"""

from __future__ import annotations

from PySide6.QtCore import QThread, Signal

COLLECT_SHARE = 0.5  # of the progress bar: asking the engine; the rest is writing the bundle


class ExportCancelled(Exception):
    """Raised from a progress step after cancel(): the export stops there."""


class ExportJob(QThread):
    progress = Signal(float, str)  # fraction, what
    succeeded = Signal(str, dict)  # path, summary
    failed = Signal(str)  # message
    cancelled = Signal()

    def __init__(self, client, path: str, *, since: float | None = None, endpoint: str = "", parent=None):
        """client: a TransportClient (or anything with EngineClient's status, call and
        page_metadata)."""
        super().__init__(parent)
        self.client, self.path, self.since = client, path, since
        self.endpoint = endpoint or getattr(client, "endpoint", "")
        self._cancel = False

    def cancel(self) -> None:
        """Stop at the next step (thread-safe: a flag the job reads)."""
        self._cancel = True

    def _step(self, start: float, share: float):
        def step(fraction: float, what: str) -> None:
            if self._cancel:
                raise ExportCancelled(what)
            self.progress.emit(start + share * fraction, what)
        return step

    def run(self) -> None:
        from gui.snapshot.bundle import write_bundle
        from gui.snapshot.collect import collect

        try:
            snap = collect(self.client, since=self.since, endpoint=self.endpoint,
                           progress=self._step(0.0, COLLECT_SHARE))
            path = write_bundle(snap, self.path, progress=self._step(COLLECT_SHARE, 1.0 - COLLECT_SHARE))
            readers = {p["reader"] for p in snap.state["scope"]["pairs"]}
            self.succeeded.emit(str(path), {"requests": len(snap.state["requests"]),
                                            "alerts": len(snap.state["alerts"]), "affected": len(readers)})
        except ExportCancelled:
            self.cancelled.emit()
        except Exception as exc:  # shown to the operator; the window keeps running
            self.failed.emit(f"{type(exc).__name__}: {exc}")
