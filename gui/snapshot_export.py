"""ExportJob: collect and write an incident snapshot off the GUI thread.

It opens its own EngineClient to the engine (the transport thread owns the window's
sockets) with the transport's CURVE keys, and reports progress through signals.
"""

from __future__ import annotations

from PySide6.QtCore import QThread, Signal


class ExportJob(QThread):
    progress = Signal(float, str)  # fraction, what
    succeeded = Signal(str, dict)  # path, summary
    failed = Signal(str)  # message

    def __init__(self, endpoint: str, path: str, *, since: float | None = None, server_key=None,
                 client_keys=None, parent=None):
        super().__init__(parent)
        self.endpoint, self.path, self.since = endpoint, path, since
        self.server_key, self.client_keys = server_key, client_keys

    def run(self) -> None:
        from engine.client import EngineClient
        from gui.snapshot.bundle import write_bundle
        from gui.snapshot.collect import collect

        try:
            self.progress.emit(0.0, "asking the engine")
            with EngineClient(self.endpoint, server_key=self.server_key, client_keys=self.client_keys,
                              timeout_s=60.0) as client:
                snap = collect(client, since=self.since, endpoint=self.endpoint)
            path = write_bundle(snap, self.path, progress=lambda f, what: self.progress.emit(f, what))
            readers = {p["reader"] for p in snap.state["scope"]["pairs"]}
            self.succeeded.emit(str(path), {"requests": len(snap.state["requests"]),
                                            "alerts": len(snap.state["alerts"]), "affected": len(readers)})
        except Exception as exc:  # shown to the operator; the window keeps running
            self.failed.emit(f"{type(exc).__name__}: {exc}")
