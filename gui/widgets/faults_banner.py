"""FaultsBanner: the standing warning that this engine runs with isolation defences off or
faults injected (an `--allow-faults` engine reproducing an incident).

It names every defence that is off and every fault that is on, from the engine's config
(status), and hides only when all defences are on and no fault is (before,
an attached window showed nothing of it).
"""

from __future__ import annotations

from engine.wire.defences import DEFENCES, FAULTS, weakening_keys
from gui import theme
from gui.model.engine_state import EngineState
from gui.widgets.banner import Banner
from gui.widgets.state_view import StateView


def weakened(config: dict) -> tuple[list[str], list[str]]:
    """(labels of the defences that are off, including I1's abort and I5's scrub turned off
    by their engine keys; labels of the faults that are on)."""
    defences, faults = config.get("defences") or {}, config.get("faults") or {}
    off = [d.label for d in DEFENCES if defences.get(d.name) is False]
    off += [f"{key.label} (engine.{key.name} = {value})" for key, value in weakening_keys(config.get("engine") or {})]
    on = [f.label for f in FAULTS if faults.get(f.name) is True]
    return off, on


class FaultsBanner(StateView, Banner):
    def __init__(self, state: EngineState, parent=None):
        super().__init__("faultsBanner", "<b>Isolation weakened on purpose (--allow-faults)</b>",
                         None, parent)
        warn = theme.color("warning").name()
        self.set_colors(None, warn, border=warn)
        self.state = state
        self.refresh()

    def follows(self) -> dict:
        return {"engine": self.refresh}

    def refresh(self) -> None:
        off, on = weakened(self.state.config or {})
        self.show_lines((["Defences OFF: " + "; ".join(off)] if off else [])
                        + (["Faults ON: " + "; ".join(on)] if on else []))
