"""FleetDialog: which Prometheus to ask for the fleet, how often, and the CURVE keys used to
attach to an engine from it. Every field is remembered in QSettings (FLEET_KEYS)."""

from __future__ import annotations

import re

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QDialog, QDoubleSpinBox, QFormLayout, QLabel, QLineEdit

from gui.dialogs.checked_form import lay_out, missing_key_file, show_problem

FLEET_KEYS = {"url": "fleet/url", "job_regex": "fleet/job_regex", "server_key": "fleet/server_key",
              "client_keys": "fleet/client_keys"}


def url_error(url: str) -> str | None:
    if not re.match(r"^https?://[^\s/]+", url.strip()):
        return "Enter Prometheus's address: http://host:9090"
    return None


def fleet_keys(settings: QSettings) -> dict:
    """The CURVE key files remembered for attaching from the Fleet view (None when unset)."""
    return {name: str(settings.value(FLEET_KEYS[name], "") or "") or None for name in ("server_key", "client_keys")}


class FleetDialog(QDialog):
    def __init__(self, parent=None, *, settings: QSettings | None = None):
        super().__init__(parent)
        self.setWindowTitle("Fleet: engines Prometheus knows")
        self.settings = settings if settings is not None else QSettings()
        value = lambda name, default="": str(self.settings.value(FLEET_KEYS[name], default) or default)
        self.url = QLineEdit(value("url", "http://127.0.0.1:9090"))
        self.job_regex = QLineEdit(value("job_regex", ".*"))
        self.refresh = QDoubleSpinBox()
        self.refresh.setRange(0, 3600)
        self.refresh.setSpecialValueText("scrape interval")
        self.refresh.setSuffix(" s")
        self.server_key = QLineEdit(value("server_key"))
        self.server_key.setPlaceholderText("optional: the engines' public .key file")
        self.client_keys = QLineEdit(value("client_keys"))
        self.client_keys.setPlaceholderText("optional: .key_secret file or key folder")
        self.error = QLabel()
        form = QFormLayout()
        form.addRow("Prometheus", self.url)
        form.addRow("Jobs (regex)", self.job_regex)
        form.addRow("Refresh every", self.refresh)
        form.addRow(self.error)
        form.addRow("Server public key", self.server_key)
        form.addRow("Client key", self.client_keys)
        self.buttons = lay_out(self, form, "Enter or a double-click on a row attaches to that engine's control "
                               "endpoint with these keys; Back (Alt+Left) returns here.", "Show fleet")
        for edit in (self.url, self.server_key, self.client_keys):
            edit.textChanged.connect(self._check)
        self.setMinimumWidth(520)
        self._check()

    def problem(self) -> str | None:
        error = url_error(self.url.text())
        if error:
            return error
        try:
            re.compile(self.job_regex.text())
        except re.error as exc:
            return f"Jobs: not a regex: {exc}"
        return missing_key_file(self.server_key.text(), self.client_keys.text())

    def _check(self, *_) -> None:
        show_problem(self.error, self.buttons, self.problem())

    def values(self) -> dict:
        """{"url", "job_regex", "refresh_s" (None: the scrape interval)}."""
        return {"url": self.url.text().strip(), "job_regex": self.job_regex.text() or ".*",
                "refresh_s": self.refresh.value() or None}

    def accept(self) -> None:
        if self.problem() is None:
            for name, edit in (("url", self.url), ("job_regex", self.job_regex), ("server_key", self.server_key),
                               ("client_keys", self.client_keys)):
                self.settings.setValue(FLEET_KEYS[name], edit.text().strip())
            super().accept()
