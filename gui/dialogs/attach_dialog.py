"""AttachDialog: which engine to attach to (tcp://host:port or ipc://path), its CURVE keys,
and whether this session is read-only. Recent addresses come from QSettings, newest first.
"""

from __future__ import annotations

import re

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QWidget,
)

from gui.dialogs.checked_form import lay_out, missing_key_file, show_problem

RECENT_KEY = "recent_engines"  # shared with the main window's File > Recent engines
MAX_RECENT = 10
_HOST = r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?)"
_TCP = re.compile(rf"^tcp://({_HOST}):(\d{{1,5}})$")


def address_error(address: str) -> str | None:
    """None for a valid tcp://host:port or ipc://path, else what is wrong with it."""
    address = address.strip()
    if not address:
        return "Enter the engine's address: tcp://host:port or ipc://path"
    if address.startswith("ipc://"):
        return None if len(address) > len("ipc://") else "ipc:// needs a socket path, e.g. ipc:///tmp/pw/ctl"
    if not address.startswith("tcp://"):
        return "The address must start with tcp:// or ipc://"
    match = _TCP.match(address)
    if match is None:
        return "Expected tcp://host:port (a host name, IPv4 or [IPv6], then the port)"
    port = int(match.group(2))
    if not 1 <= port <= 65535:
        return f"Port {port} is out of range: it must be between 1 and 65535"
    return None


def recent_engines(settings: QSettings) -> list[str]:
    value = settings.value(RECENT_KEY, [])
    if isinstance(value, str):  # QSettings hands back a one-item list as a plain string
        value = [value]
    return [str(v) for v in value or []]


def remember_engine(settings: QSettings, address: str) -> None:
    """Put `address` first in the recent list (no duplicates, at most MAX_RECENT)."""
    recent = [a for a in recent_engines(settings) if a != address]
    settings.setValue(RECENT_KEY, [address, *recent][:MAX_RECENT])


def _path_row(edit: QLineEdit, *buttons: QPushButton) -> QWidget:
    row = QWidget()
    layout = QHBoxLayout(row)
    layout.setContentsMargins(0, 0, 0, 0)
    layout.addWidget(edit, 1)
    for button in buttons:
        layout.addWidget(button)
    return row


class AttachDialog(QDialog):
    def __init__(self, recent: list[str] | None = None, parent=None, *, settings: QSettings | None = None,
                 address: str = ""):
        """recent: addresses newest first (default: read from `settings`, by default QSettings()).
        Accepting puts the address first in the settings' recent list."""
        super().__init__(parent)
        self.setWindowTitle("Attach to an engine")
        self.settings = settings if settings is not None else QSettings()
        self.address = QComboBox()
        self.address.setEditable(True)
        self.address.addItems(recent if recent is not None else recent_engines(self.settings))
        self.address.setCurrentText(address or self.address.itemText(0) or "tcp://127.0.0.1:5555")
        self.address.setMinimumWidth(320)
        self.error = QLabel()  # short messages, no wrapping: a wrapped label clips in a form
        self.server_key = QLineEdit()
        self.server_key.setPlaceholderText("optional: the engine's public .key file")
        self.client_keys = QLineEdit()
        self.client_keys.setPlaceholderText("optional: .key_secret file or key folder")
        server_browse = QPushButton("Browse…")
        server_browse.clicked.connect(self._pick_server_key)
        client_file, client_dir = QPushButton("File…"), QPushButton("Folder…")
        client_file.clicked.connect(self._pick_client_file)
        client_dir.clicked.connect(self._pick_client_dir)
        self.readonly = QCheckBox("Read-only: watch only, every control action disabled")

        form = QFormLayout()
        form.addRow("Engine address", self.address)
        form.addRow(self.error)
        form.addRow("Server public key", _path_row(self.server_key, server_browse))
        form.addRow("Client key", _path_row(self.client_keys, client_file, client_dir))
        form.addRow("", self.readonly)
        self.buttons = lay_out(self, form, "Remote engines need CURVE: the server's public key and a client key it admits "
                      "(python main.py keys).", 'Attach')
        self.address.editTextChanged.connect(self._check)
        self.server_key.textChanged.connect(self._check)
        self.client_keys.textChanged.connect(self._check)
        self.setMinimumWidth(600)
        self._check()

    def problem(self) -> str | None:
        """What stops attaching, or None."""
        error = address_error(self.address.currentText())
        if error:
            return error
        return missing_key_file(self.server_key.text(), self.client_keys.text())

    def _check(self, *_) -> None:
        show_problem(self.error, self.buttons, self.problem())

    def result_values(self) -> dict:
        """{"endpoint", "server_key", "client_keys", "readonly"}; key paths are None when empty."""
        return {
            "endpoint": self.address.currentText().strip(),
            "server_key": self.server_key.text().strip() or None,
            "client_keys": self.client_keys.text().strip() or None,
            "readonly": self.readonly.isChecked(),
        }

    def accept(self) -> None:
        if self.problem() is None:
            remember_engine(self.settings, self.result_values()["endpoint"])
            super().accept()

    def _pick_server_key(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Server public key", "", "Public keys (*.key);;All files (*)")
        if path:
            self.server_key.setText(path)

    def _pick_client_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Client key", "", "Secret keys (*.key_secret);;All files (*)")
        if path:
            self.client_keys.setText(path)

    def _pick_client_dir(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Client key folder")
        if path:
            self.client_keys.setText(path)
