"""ProbeDialog: which OpenAI-compatible endpoint to probe for leaks, how many rounds, and how
often; or, ticked, the cache_salt check with how many pairs. Start is enabled only while
everything typed is valid; the message names the field and the value that is not. The last
URL and model used come back from QSettings.

The leak probe closes the dialog and runs (accepted). The salt check keeps it open: Start
emits `salt_requested` with the request, the window runs it off the GUI thread and hands the
verdict back through `show_salt_result`.
"""

from __future__ import annotations

from PySide6.QtCore import QSettings, Qt, Signal
from PySide6.QtWidgets import QCheckBox, QDialog, QDialogButtonBox, QFormLayout, QLabel, QLineEdit, QSpinBox

from engine.adapters.salt_check import DEFAULT_PAIRS, PAIRS
from engine.wire.sockets import is_loopback_host as is_loopback
from gui.dialogs.checked_form import lay_out, show_problem
from gui.model.probe_schedule import DEFAULT_URL, MAX_EVERY_MINUTES, MAX_ROUNDS, ProbeRequest, check_probe_request

LAST_KEY = "probe/last"  # [url, model] as accepted


class ProbeDialog(QDialog):
    salt_requested = Signal(object)  # ProbeRequest with salt_check: the dialog stays open for its verdict

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
        self.salt_check = QCheckBox("Check cache_salt isolation of the prefix cache instead of leak rounds")
        self.pairs = QSpinBox()
        self.pairs.setRange(0, PAIRS[1])  # below PAIRS[0] is shown refused, with the reason
        self.pairs.setValue(DEFAULT_PAIRS)
        self.salt_result = QLabel()
        self.salt_result.setObjectName("salt-result")
        self.salt_result.setWordWrap(True)
        self.salt_result.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.salt_result.hide()
        self.salt_running = False
        self.error = QLabel()
        self.error.setWordWrap(True)
        form = QFormLayout()
        form.addRow("URL", self.url)
        form.addRow("Model", self.model)
        form.addRow("Rounds", self.rounds)
        form.addRow("Every", self.every)
        form.addRow("", self.allow_remote)
        form.addRow("", self.salt_check)
        form.addRow("Pairs", self.pairs)
        form.addRow(self.salt_result)
        form.addRow(self.error)
        self.buttons = lay_out(self, form, "Each round sends a marker prompt, then 3 prompts of the same length asking for one token "
                      "past the context window. A healthy engine rejects those; a piece of the marker in a reply "
                      "is another request's data: a critical canary_marker_in_output alert. At most 2 requests "
                      "a second; with Every set it repeats until stopped (Tools → Stop the probe). "
                      "The cache_salt check instead sends pairs of one-token requests over fresh random "
                      "prefixes, the same salt twice (must hit the cache) and two salts (must miss), and shows "
                      "its verdict here; salts sharing the cache is a critical alert.", 'Start probe')
        for edit in (self.url, self.model):
            edit.textChanged.connect(self._check)
        for spin in (self.rounds, self.every, self.pairs):
            spin.valueChanged.connect(self._check)
        for box in (self.allow_remote, self.salt_check):
            box.toggled.connect(self._check)
        self.setMinimumWidth(560)
        self._check()

    def values(self) -> ProbeRequest:
        """What to probe; raises ValueError naming the field and the value."""
        return check_probe_request(self.url.text(), self.model.text(), self.rounds.value(), self.every.value(),
                                   self.allow_remote.isChecked(), is_loopback=is_loopback,
                                   salt_check=self.salt_check.isChecked(), pairs=self.pairs.value())

    def problem(self) -> str | None:
        try:
            self.values()
        except ValueError as exc:
            return str(exc)
        return None

    def _check(self, *_) -> None:
        salt = self.salt_check.isChecked()
        self.rounds.setEnabled(not salt)
        self.pairs.setEnabled(salt)
        show_problem(self.error, self.buttons, self.problem())
        if self.salt_running:  # one salt check at a time from here
            self.buttons.button(QDialogButtonBox.StandardButton.Ok).setEnabled(False)

    def show_salt_result(self, text: str, *, running: bool = False) -> None:
        """The salt check's verdict and reasons (or its progress, or its error) in the dialog."""
        self.salt_running = running
        self.salt_result.setText(text)
        self.salt_result.show()
        self._check()

    def accept(self) -> None:
        if self.problem() is not None or self.salt_running:
            return
        self.settings.setValue(LAST_KEY, [self.url.text().strip(), self.model.text().strip()])
        if self.salt_check.isChecked():
            request = self.values()
            self.show_salt_result(f"Running the salt check: {4 * request.pairs + 2} requests to {request.url}…",
                                  running=True)
            self.salt_requested.emit(request)
            return
        super().accept()
