"""KvAttachDialog: which vLLM / SGLang KV-event endpoints to watch, their replay endpoints and
the wire dialect. Attach is enabled only while everything typed is valid; the message names
the value that is not. The last values used come back from QSettings.
"""

from __future__ import annotations

import re

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QComboBox, QDialog, QFormLayout, QLabel, QLineEdit

from engine.adapters.kv_attach import KvAttach, check_kv_attach
from engine.adapters.kv_event_decode import DIALECTS, KvEventError
from gui.dialogs.checked_form import lay_out, show_problem

LAST_KEY = "kv_events/last"  # [endpoints, replay, dialect] as typed


def split_addresses(text: str) -> list[str]:
    """Addresses separated by spaces, commas or new lines."""
    return [part for part in re.split(r"[\s,]+", text.strip()) if part]


class KvAttachDialog(QDialog):
    def __init__(self, parent=None, *, settings: QSettings | None = None, endpoints: str | None = None,
                 replay: str | None = None, dialect: str | None = None):
        """Fields start from the arguments, else from the last values accepted (`settings`, by
        default QSettings()). Accepting stores them there."""
        super().__init__(parent)
        self.setWindowTitle("Attach to vLLM / SGLang KV events")
        self.settings = settings if settings is not None else QSettings()
        last = self.settings.value(LAST_KEY, [])
        last = list(last) + [""] * 3 if isinstance(last, (list, tuple)) else [""] * 3
        self.endpoints = QLineEdit(endpoints if endpoints is not None else last[0] or "tcp://127.0.0.1:5557")
        self.endpoints.setPlaceholderText("tcp://gpu-box:5557 tcp://gpu-box:5558 (one per data-parallel rank)")
        self.replay = QLineEdit(replay if replay is not None else last[1])
        self.replay.setPlaceholderText("optional: each endpoint's replay address, same order ('-' for none)")
        self.dialect = QComboBox()
        self.dialect.addItems(list(DIALECTS))
        self.dialect.setCurrentText(dialect or last[2] or "auto")
        self.error = QLabel()
        self.error.setWordWrap(True)
        form = QFormLayout()
        form.addRow("Event endpoints", self.endpoints)
        form.addRow("Replay endpoints", self.replay)
        form.addRow("Dialect", self.dialect)
        form.addRow(self.error)
        self.buttons = lay_out(self, form, "Start vLLM with --kv-events-config '{\"enable_kv_cache_events\": true, \"publisher\": "
                      "\"zmq\", \"endpoint\": \"tcp://*:5557\", \"replay_endpoint\": \"tcp://*:5560\"}' (SGLang "
                      "takes the same publisher, endpoint and replay_endpoint keys) and connect to its host; "
                      "data-parallel rank N publishes on the port + N. Dialect auto reads every known variant.", 'Attach')
        for edit in (self.endpoints, self.replay):
            edit.textChanged.connect(self._check)
        self.dialect.currentTextChanged.connect(self._check)
        self.setMinimumWidth(640)
        self._check()

    def problem(self) -> str | None:
        """What stops attaching (naming the field and the value), or None."""
        endpoints, replay = split_addresses(self.endpoints.text()), split_addresses(self.replay.text())
        for field, check in (("Event endpoints", lambda: check_kv_attach(endpoints, (), self.dialect.currentText())),
                             ("Replay endpoints", lambda: check_kv_attach(endpoints, replay,
                                                                          self.dialect.currentText()))):
            try:
                check()
            except KvEventError as exc:
                return f"{field}: {exc}"
        return None

    def _check(self, *_) -> None:
        show_problem(self.error, self.buttons, self.problem())

    def values(self) -> KvAttach:
        """What to watch; raises KvEventError while problem() is not None."""
        return check_kv_attach(split_addresses(self.endpoints.text()), split_addresses(self.replay.text()),
                               self.dialect.currentText())

    def accept(self) -> None:
        if self.problem() is None:
            self.settings.setValue(LAST_KEY, [self.endpoints.text().strip(), self.replay.text().strip(),
                                              self.dialect.currentText()])
            super().accept()
