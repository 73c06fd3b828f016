"""run_gui: the QApplication, the window, and the engine it hosts or attaches to."""

from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtCore import QCoreApplication, QTimer
from PySide6.QtWidgets import QApplication, QMessageBox

from gui.hosting import HostedEngine
from gui.main_window import MainWindow
from gui.transport import TransportThread


def load_keys(server_key: str | None, client_keys: str | None):
    """(server public key, (client public, client secret)) from files, or (None, None)."""
    if not server_key and not client_keys:
        return None, None
    if not (server_key and client_keys):
        raise ValueError("CURVE needs both --server-key and --client-keys")
    from engine.client.keys import load_client_keys, load_public_key

    return load_public_key(server_key), load_client_keys(client_keys)


class App:
    """Owns the window, the hosted engine (if any) and the switch between engines."""

    def __init__(self, args):
        self.args = args
        self.window = MainWindow(readonly=args.readonly, theme=args.theme)
        self.window.attach_requested.connect(self.attach_from_dialog)
        self.hosted: HostedEngine | None = None
        self.window.destroyed.connect(self.stop_hosted)

    def start(self) -> None:
        args = self.args
        if args.attach:
            self.attach(args.attach, *load_keys(args.server_key, args.client_keys))
        else:
            self.host(args.config)
        if args.demo_load:
            QTimer.singleShot(0, lambda: self.window.toggle_demo(True))

    def host(self, config: str | None) -> None:
        extra = ["--allow-faults"] if getattr(self.args, "allow_faults", False) else []
        self.hosted = HostedEngine(config, extra, parent=self.window)
        self.hosted.ready.connect(lambda control, _tel: self.attach(control, hosted=True))
        self.hosted.failed.connect(self._hosted_failed)
        self.window.status_line.set_connection("hosted engine starting")
        self.hosted.start()

    def attach(self, endpoint: str, server_key=None, client_keys=None, *, hosted: bool = False) -> None:
        transport = TransportThread(endpoint, server_key=server_key, client_keys=client_keys)
        self.window.attach(transport, endpoint, hosted=hosted)

    def attach_from_dialog(self, values: dict) -> None:
        try:
            keys = load_keys(values.get("server_key"), values.get("client_keys"))
        except (ValueError, OSError) as exc:
            QMessageBox.warning(self.window, "Attach", str(exc))
            return
        self.stop_hosted()
        self.window.set_readonly(bool(values.get("readonly", self.window.readonly)))
        self.attach(values["endpoint"], *keys)

    def _hosted_failed(self, why: str) -> None:
        self.window.statusBar().showMessage(why)
        self.window.status_line.set_connection("hosted engine stopped")

    def stop_hosted(self) -> None:
        if self.hosted is not None:
            self.hosted.stop()
            self.hosted = None


def run_gui(args) -> int:
    QCoreApplication.setOrganizationName("PageWarden")
    QCoreApplication.setApplicationName("PageWarden")
    app = QApplication.instance() or QApplication(sys.argv[:1])
    try:
        shell = App(args)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    window = shell.window
    try:
        shell.start()
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    window.show()
    if args.quit_after is not None:
        def finish():
            if args.screenshot:
                Path(args.screenshot).parent.mkdir(parents=True, exist_ok=True)
                window.grab().save(args.screenshot)
            window.close()
        QTimer.singleShot(int(args.quit_after * 1000), finish)
    app.aboutToQuit.connect(shell.stop_hosted)
    code = app.exec()
    shell.stop_hosted()
    return code
