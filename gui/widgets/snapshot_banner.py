"""SnapshotBanner: over the window while it shows a snapshot bundle instead of an engine."""

from __future__ import annotations

from datetime import datetime, timezone

from PySide6.QtCore import Signal

from gui import theme
from gui.widgets.banner import Banner


def _utc(t) -> str:
    try:
        return datetime.fromtimestamp(float(t), timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (TypeError, ValueError, OverflowError, OSError):
        return "an unknown time"


class SnapshotBanner(Banner):
    close_requested = Signal()

    def __init__(self, parent=None):
        super().__init__("snapshotBanner", "", "Close snapshot", parent)
        self.close_button = self.button
        self.close_button.clicked.connect(self.close_requested)
        self.verified = True
        self.hide()

    def show_snapshot(self, manifest: dict, path: str, warnings: list[str]) -> None:
        hosts = manifest.get("hostnames") if isinstance(manifest.get("hostnames"), dict) else {}
        window = manifest.get("window") if isinstance(manifest.get("window"), dict) else {}
        self.title.setText("<b>Snapshot (read-only)</b>")
        lines = [f"of engine {manifest.get('endpoint') or '?'} on {hosts.get('engine') or '?'}, taken "
                 f"{_utc(manifest.get('created_unix'))}",
                 f"{path} — window {_utc(window.get('since'))} to {_utc(window.get('until'))}. "
                 f"Control actions are off; Close snapshot returns to the live engine."]
        self.verified = not warnings
        if warnings:
            shown = warnings[:6] + ([f"… and {len(warnings) - 6} more"] if len(warnings) > 6 else [])
            lines[0] = "WARNING: this bundle does not verify against its manifest · " + lines[0]
            lines.append("It may have been altered or damaged:\n  " + "\n  ".join(shown))
        bg = theme.color("danger_bg").name() if warnings else "#1d4f91"  # red when it fails to verify
        self.set_colors(bg, theme.color("danger_fg").name())
        self.show_lines(lines)
