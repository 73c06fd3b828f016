"""Light and dark themes: one QPalette each, pyqtgraph colours, and the few signal colours
(danger, warning, ok, muted) that widgets use for severity and state.

Widgets ask `current_mode()` when they paint, so a theme switch only needs
`apply_theme(app, mode)`; Qt sends every widget a PaletteChange event.
"""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication

MODES = ("system", "dark", "light")

_BASE = {
    # inputs (base) a step lighter than the window, so Fusion's dark outlines still show them
    "dark": dict(window="#1f2226", base="#272b31", alt="#2d3238", text="#e6e6e6", button="#343941",
                 highlight="#3d7bd9", highlight_text="#ffffff", link="#7ab0ff", disabled="#7b8088",
                 tooltip_base="#30353c", mid="#4a5058", dark="#111315", light="#5a616b"),
    "light": dict(window="#f3f3f3", base="#ffffff", alt="#f5f7fa", text="#1d1d1f", button="#e9e9eb",
                  highlight="#2d6fd2", highlight_text="#ffffff", link="#1d5fbf", disabled="#8c8c91",
                  tooltip_base="#ffffff", mid="#b8b8bc", dark="#8c8c91", light="#ffffff"),
}

# Signal colours, chosen per theme so text stays readable on the theme's base colour;
# danger_bg (banners, STALE) is one red in both, so a banner needs no restyle on a switch.
_SIGNAL = {
    "dark": dict(danger="#ff6b6b", warning="#f0b54a", ok="#5cc98a", info="#6fa8ff", muted="#8b9098",
                 danger_bg="#b3261e", danger_fg="#ffffff"),
    "light": dict(danger="#c62828", warning="#a86500", ok="#23803f", info="#1d5fbf", muted="#7a7a80",
                  danger_bg="#b3261e", danger_fg="#ffffff"),
}

# Curve colours (pools, series): distinct on each background.
_SERIES = {
    "dark": ("#6fa8ff", "#f0b54a", "#5cc98a", "#e377c2", "#bcbd22", "#17becf", "#ff8a65"),
    "light": ("#1f5fbf", "#c26a00", "#23803f", "#a0307f", "#7a7a00", "#0f7f8f", "#c0392b"),
}

_PLOT = {"dark": ("#1a1d21", "#c8c8c8"), "light": ("#ffffff", "#333333")}


def system_mode() -> str:
    """"dark" or "light" as the platform reports it (light when it does not say)."""
    scheme = QGuiApplication.styleHints().colorScheme()
    return "dark" if scheme == Qt.ColorScheme.Dark else "light"


def build_palette(mode: str) -> QPalette:
    """The QPalette of "dark" or "light"."""
    c = {k: QColor(v) for k, v in _BASE[mode].items()}
    pal = QPalette()
    roles = {
        QPalette.Window: c["window"], QPalette.WindowText: c["text"], QPalette.Base: c["base"],
        QPalette.AlternateBase: c["alt"], QPalette.Text: c["text"], QPalette.Button: c["button"],
        QPalette.ButtonText: c["text"], QPalette.BrightText: QColor("#ff5252"),
        QPalette.Highlight: c["highlight"], QPalette.HighlightedText: c["highlight_text"],
        QPalette.Link: c["link"], QPalette.ToolTipBase: c["tooltip_base"], QPalette.ToolTipText: c["text"],
        QPalette.PlaceholderText: c["disabled"], QPalette.Mid: c["mid"], QPalette.Dark: c["dark"],
        QPalette.Light: c["light"], QPalette.Midlight: c["light"], QPalette.Shadow: QColor("#000000"),
    }
    for role, color in roles.items():
        pal.setColor(role, color)
    for role in (QPalette.WindowText, QPalette.Text, QPalette.ButtonText, QPalette.HighlightedText):
        pal.setColor(QPalette.Disabled, role, c["disabled"])
    pal.setColor(QPalette.Disabled, QPalette.Highlight, c["mid"])
    return pal


def apply_theme(app: QApplication, mode: str = "system") -> str:
    """Apply "system", "dark" or "light" to the whole app; returns the effective "dark"/"light".

    Raises ValueError for any other mode. Uses the Fusion style, the one that honours
    a palette on every platform.
    """
    if mode not in MODES:
        raise ValueError(f"theme {mode!r} is not one of {', '.join(MODES)}")
    effective = system_mode() if mode == "system" else mode
    if app.style().name().lower() != "fusion":
        app.setStyle("Fusion")
    app.setPalette(build_palette(effective))
    background, foreground = _PLOT[effective]
    pg.setConfigOption("background", background)
    pg.setConfigOption("foreground", foreground)
    return effective


def current_mode() -> str:
    """The effective theme of the running app, read from its palette."""
    app = QApplication.instance()
    if app is None:
        return "light"
    return "dark" if app.palette().color(QPalette.Window).lightness() < 128 else "light"


def color(name: str, mode: str | None = None) -> QColor:
    """A signal colour: danger, warning, ok, info, muted, danger_bg, danger_fg."""
    return QColor(_SIGNAL[mode or current_mode()][name])


def series_color(index: int, mode: str | None = None) -> QColor:
    colors = _SERIES[mode or current_mode()]
    return QColor(colors[index % len(colors)])


def plot_colors(mode: str | None = None) -> tuple[str, str]:
    """(background, foreground) for pyqtgraph in this theme."""
    return _PLOT[mode or current_mode()]


SEVERITY_COLOR = {"critical": "danger", "error": "danger", "warning": "warning", "info": "info"}


def severity_color(severity: str, mode: str | None = None) -> QColor:
    return color(SEVERITY_COLOR.get(severity, "muted"), mode)
