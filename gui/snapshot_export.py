"""ExportJob: collect and write an incident snapshot off the GUI thread.

It asks the engine through the window's transport (a TransportClient: the transport
thread stays the one owner of the sockets), writes the bundle, and reports progress
through signals.
"""

from __future__ import annotations

from PySide6.QtCore import QThread, Signal


class ExportJob(QThread):
    progress = Signal(float, str)  # fraction, what
    succeeded = Signal(str, dict)  # path, summary
    failed = Signal(str)  # message

    def __init__(self, client, path: str, *, since: float | None = None, endpoint: str = "", parent=None):
        """client: a TransportClient (or anything with EngineClient's status, call and
        page_metadata)."""
        super().__init__(parent)
        self.client, self.path, self.since = client, path, since
        self.endpoint = endpoint or getattr(client, "endpoint", "")

    def run(self) -> None:
        from gui.snapshot.bundle import write_bundle
        from gui.snapshot.collect import collect

        try:
            self.progress.emit(0.0, "asking the engine")
            snap = collect(self.client, since=self.since, endpoint=self.endpoint)
            path = write_bundle(snap, self.path, progress=lambda f, what: self.progress.emit(f, what))
            readers = {p["reader"] for p in snap.state["scope"]["pairs"]}
            self.succeeded.emit(str(path), {"requests": len(snap.state["requests"]),
                                            "alerts": len(snap.state["alerts"]), "affected": len(readers)})
        except Exception as exc:  # shown to the operator; the window keeps running
            self.failed.emit(f"{type(exc).__name__}: {exc}")
