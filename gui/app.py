"""run_gui: the QApplication, the window, and the engine it hosts or attaches to."""

from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtCore import QCoreApplication, QTimer
from PySide6.QtWidgets import QApplication, QMessageBox

from engine.adapters.kv_attach import KvAttach, check_kv_attach
from engine.adapters.kv_event_decode import KvEventError
from gui.hosting import HostedEngine
from gui.main_window import MainWindow
from gui.quit_signals import QuitSignals
from gui.transport import TransportThread


def load_keys(server_key: str | None, client_keys: str | None):
    """(server public key, (client public, client secret)) from files, or (None, None)."""
    if not server_key and not client_keys:
        return None, None
    if not (server_key and client_keys):
        raise ValueError("CURVE needs both --server-key and --client-keys")
    from engine.wire.curve import load_client_keys, load_public_key

    return load_public_key(server_key), load_client_keys(client_keys)


def kv_attach_from_args(args) -> KvAttach | None:
    """--attach-kv-events ADDR... [--replay ADDR...] [--dialect D] as a KvAttach, or None when
    not given. Raises ValueError (KvEventError) naming the flag or address that is wrong."""
    endpoints = getattr(args, "attach_kv_events", None)
    replay, dialect = getattr(args, "replay", None), getattr(args, "dialect", None)
    if not endpoints:
        if replay or dialect:
            raise ValueError("--replay and --dialect go with --attach-kv-events ADDR [ADDR ...]")
        return None
    if getattr(args, "attach", None):
        raise ValueError("--attach (a PageWarden engine) and --attach-kv-events (vLLM / SGLang) exclude each other; "
                         "give one")
    if getattr(args, "demo_load", False):
        raise ValueError("--demo-load needs a PageWarden engine; it does not go with --attach-kv-events")
    return check_kv_attach(endpoints, replay or (), dialect)


class App:
    """Owns the window, the hosted engine (if any) and the switch between engines."""

    def __init__(self, args):
        self.args = args
        self.window = MainWindow(readonly=args.readonly, theme=args.theme)
        self.window.attach_requested.connect(self.attach_from_dialog)
        self.window.kv_attach_requested.connect(self.attach_kv_events_from_dialog)
        self.hosted: HostedEngine | None = None
        self.window.destroyed.connect(self.stop_hosted)

    def start(self) -> None:
        args = self.args
        kv_attach = kv_attach_from_args(args)
        if kv_attach is not None:
            self.window.attach_kv_events(kv_attach)
            return
        fleet = getattr(args, "fleet", None)
        if getattr(args, "fleet_refresh", None) is not None and not fleet:
            raise ValueError("--fleet-refresh goes with --fleet URL")
        if args.attach:
            self.attach(args.attach, *load_keys(args.server_key, args.client_keys))
        elif not fleet:  # the Fleet view alone: the operator attaches from it
            self.host(args.config)
        if fleet:
            QTimer.singleShot(0, lambda: self.window.fleet.open(fleet, refresh_s=args.fleet_refresh))
        if args.demo_load:
            QTimer.singleShot(0, lambda: self.window.toggle_demo(True))

    def host(self, config: str | None) -> None:
        extra = ["--allow-faults"] if getattr(self.args, "allow_faults", False) else []
        if self.window.readonly:  # the server enforces it, not only the window (docs/SECURITY.md)
            extra += ["--local-role", "viewer"]
        self.hosted = HostedEngine(config, extra, parent=self.window)
        self.hosted.ready.connect(lambda control, _tel: self.attach(control, hosted=True))
        self.hosted.failed.connect(self._hosted_failed)
        self.window.source.set_note("hosted engine starting")
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

    def attach_kv_events_from_dialog(self, attach: KvAttach) -> None:
        try:
            self.window.attach_kv_events(attach)
        except KvEventError as exc:
            QMessageBox.warning(self.window, "Attach to vLLM / SGLang events", str(exc))
            return
        self.stop_hosted()

    def _hosted_failed(self, why: str) -> None:
        self.window.show_message(why, 0, "danger")
        self.window.source.set_note("hosted engine stopped")

    def quit(self, *_) -> None:
        """What File -> Quit does (close the window, which stops the hosted engine), and end
        the event loop even while a modal dialog holds it."""
        self.window.close()
        QApplication.quit()

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
    signals = QuitSignals(app).install()  # kill -TERM / Ctrl+C / a closed terminal: quit like Ctrl+Q
    signals.received.connect(shell.quit)
    try:
        return _run(app, shell, args)
    finally:
        signals.uninstall()


def _run(app: QApplication, shell: App, args) -> int:
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
