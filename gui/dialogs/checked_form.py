"""The shape the input dialogs share: a form, a muted note, OK/Cancel, and a red line that
names what is wrong and keeps OK disabled until it is fixed."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QDialog, QDialogButtonBox, QFormLayout, QLabel, QVBoxLayout

from gui import theme


def lay_out(dialog: QDialog, form: QFormLayout, note: str, ok_text: str) -> QDialogButtonBox:
    """Form, note and OK/Cancel (OK renamed `ok_text`) in `dialog`; returns the buttons."""
    label = QLabel(note)
    label.setWordWrap(True)
    label.setStyleSheet(f"color: {theme.color('muted').name()};")
    buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
    buttons.button(QDialogButtonBox.StandardButton.Ok).setText(ok_text)
    buttons.accepted.connect(dialog.accept)
    buttons.rejected.connect(dialog.reject)
    layout = QVBoxLayout(dialog)
    layout.addLayout(form)
    layout.addWidget(label)
    layout.addWidget(buttons)
    return buttons


def show_problem(error: QLabel, buttons: QDialogButtonBox, problem: str | None) -> None:
    """The problem in red (hidden when None); OK only when there is none."""
    error.setText(problem or "")
    error.setVisible(bool(problem))
    error.setStyleSheet(f"color: {theme.color('danger').name()};")
    buttons.button(QDialogButtonBox.StandardButton.Ok).setEnabled(problem is None)


def missing_key_file(server_key: str, client_keys: str) -> str | None:
    """The CURVE key path (server public key, client key) a form names that does not exist, or
    None; an empty field names none."""
    for label, text in (("server public key", server_key), ("client key", client_keys)):
        path = text.strip()
        if path and not Path(path).expanduser().exists():
            return f"{label.capitalize()} not found: {path}"
    return None
