"""ProbeDialog: which OpenAI-compatible endpoint to probe for leaks, how many rounds, and how
often. Start is enabled only while everything typed is valid; the message names the field and
the value that is not. The last URL and model used come back from QSettings.
"""

from __future__ import annotations

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QCheckBox, QDialog, QFormLayout, QLabel, QLineEdit, QSpinBox

from engine.wire.sockets import is_loopback_host as is_loopback
from gui.dialogs.checked_form import lay_out, show_problem
from gui.model.probe_schedule import DEFAULT_URL, MAX_EVERY_MINUTES, MAX_ROUNDS, ProbeRequest, check_probe_request

LAST_KEY = "probe/last"  # [url, model] as accepted


class ProbeDialog(QDialog):
    def __init__(self, parent=None, *, settings: QSettings | None = None):
        super().__init__(parent)
        self.setWindowTitle("Probe an OpenAI endpoint")
        self.settings = settings if settings is not None else QSettings()
        last = self.settings.value(LAST_KEY, [])
        last = list(last) + ["", ""] if isinstance(last, (list, tuple)) else ["", ""]
        self.url = QLineEdit(last[0] or DEFAULT_URL)
        self.url.setPlaceholderText(DEFAULT_URL)
        self.model = QLineEdit(last[1])
        self.model.setPlaceholderText("optional: the first of GET /v1/models")
        self.rounds = QSpinBox()
        self.rounds.setRange(0, MAX_ROUNDS)  # 0 is shown refused, with the reason
        self.rounds.setValue(3)
        self.every = QSpinBox()
        self.every.setRange(0, MAX_EVERY_MINUTES)
        self.every.setSpecialValueText("once")
        self.every.setSuffix(" min")
        self.allow_remote = QCheckBox("Allow a remote host (the probe sends its prompts there)")
        self.error = QLabel()
        self.error.setWordWrap(True)
        form = QFormLayout()
        form.addRow("URL", self.url)
        form.addRow("Model", self.model)
        form.addRow("Rounds", self.rounds)
        form.addRow("Every", self.every)
        form.addRow("", self.allow_remote)
        form.addRow(self.error)
        self.buttons = lay_out(self, form, "Each round sends a marker prompt, then 3 prompts of the same length asking for one token "
                      "past the context window. A healthy engine rejects those; a piece of the marker in a reply "
                      "is another request's data: a critical canary_marker_in_output alert. At most 2 requests "
                      "a second; with Every set it repeats until stopped (Tools → Stop the probe).", 'Start probe')
        for edit in (self.url, self.model):
            edit.textChanged.connect(self._check)
        for spin in (self.rounds, self.every):
            spin.valueChanged.connect(self._check)
        self.allow_remote.toggled.connect(self._check)
        self.setMinimumWidth(560)
        self._check()

    def values(self) -> ProbeRequest:
        """What to probe; raises ValueError naming the field and the value."""
        return check_probe_request(self.url.text(), self.model.text(), self.rounds.value(), self.every.value(),
                                   self.allow_remote.isChecked(), is_loopback=is_loopback)

    def problem(self) -> str | None:
        try:
            self.values()
        except ValueError as exc:
            return str(exc)
        return None

    def _check(self, *_) -> None:
        show_problem(self.error, self.buttons, self.problem())

    def accept(self) -> None:
        if self.problem() is None:
            self.settings.setValue(LAST_KEY, [self.url.text().strip(), self.model.text().strip()])
            super().accept()
