"""AboutDialog: what PageWarden is, its version, the isolation invariants and the shortcuts."""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QVBoxLayout

ABOUT = ("PageWarden is a control room for disaggregated LLM inference that makes KV-cache isolation "
         "visible and checkable. It shows every KV page and the request that owns it, warns when the "
         "context window is larger than the KV pools can hold, raises an alert the moment a request reads "
         "a page it does not own, and exports incident snapshots that name exactly the requests affected.")

INVARIANTS = (
    ("I1 ownership", "attention reads only pages that carry the request's own writer tag"),
    ("I2 admission", "a request that cannot fit is rejected before any page is allocated"),
    ("I3 transfer", "pages become WRITTEN only after a matching manifest and all their bytes"),
    ("I4 writer lifetime", "a transfer's target page is not reused until it completes or is cancelled"),
    ("I5 scrub", "freed pages are scrubbed before reuse (zero, poison; none only to measure)"),
    ("I6 capacity", "the context window is checked against every pool's real capacity"),
)


class AboutDialog(QDialog):
    def __init__(self, version: str, shortcuts: Mapping[str, str] | Iterable[tuple[str, str]] = (),
                 parent=None):
        """shortcuts: {what it does: keys}, or (what it does, keys) pairs."""
        super().__init__(parent)
        self.setWindowTitle("About PageWarden")
        pairs = list(shortcuts.items()) if isinstance(shortcuts, Mapping) else list(shortcuts)
        invariants = "".join(f"<tr><td><b>{html.escape(name)}</b>&nbsp;&nbsp;</td><td>{html.escape(what)}</td></tr>"
                             for name, what in INVARIANTS)
        keys = "".join(f"<tr><td><code>{html.escape(k)}</code>&nbsp;&nbsp;</td><td>{html.escape(what)}</td></tr>"
                       for what, k in pairs)
        text = (f"<h2>PageWarden <span style='font-weight:normal'>{html.escape(version)}</span></h2>"
                f"<p>{html.escape(ABOUT)}</p><h3>Isolation invariants</h3><table>{invariants}</table>")
        if keys:
            text += f"<h3>Keyboard shortcuts</h3><table>{keys}</table>"
        self.text = QLabel(text)
        self.text.setTextFormat(Qt.RichText)
        self.text.setWordWrap(True)
        self.text.setTextInteractionFlags(Qt.TextSelectableByMouse)
        buttons = QDialogButtonBox(QDialogButtonBox.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.text)
        layout.addWidget(buttons)
        self.setMinimumWidth(760)
