"""StateView: a view that shows one EngineState and repaints on the changes it names.

A view lists its subscriptions in `follows()` ({event name: callback}, names from
`EngineState.EVENTS`, or `topic_event(name)` for any telemetry topic); assigning
`view.state = other` moves them to the other state (a new engine, a snapshot). The window
finds every StateView among its children and hands each (unless `shows_window_state` is
False) the new state: adding a view needs no change to the window's refresh.

A view class that declares `dock = Dock(...)` needs no change to the window either: the
window imports every module of gui/widgets (`docked_view_classes`), makes one of each
declared view over its state and gives it a dock and a View menu entry.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass

from gui.model.engine_state import EngineState
from gui.model.events import Subscriptions


@dataclass(frozen=True)
class Dock:
    """Where the window places a view class that declares it."""

    title: str  # the dock's title and its View menu entry
    area: str = "right"  # "left" | "right" | "bottom": tabbed with the docks already there
    shown: bool = True  # False: hidden until the operator opens it from the View menu
    shortcut: str = ""  # toggles it (listed in Help → About)


DOCKED: list[type] = []  # every StateView class with a Dock, in the order their modules were imported


class StateView:
    shows_window_state = True  # False: a view of another model (the window leaves it alone)
    dock: Dock | None = None  # set on a class: the window places one of it (see the module's docstring)

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("dock") is not None:
            DOCKED.append(cls)

    def follows(self) -> dict[str, Callable[[], object]]:
        """{EngineState event: callback}; called once, when the view first gets a state."""
        return {}

    @property
    def state(self) -> EngineState:
        return self._state

    @state.setter
    def state(self, state: EngineState) -> None:
        subscriptions = self.__dict__.get("_subscriptions")
        if subscriptions is None:
            subscriptions = self._subscriptions = Subscriptions(**self.follows())
        replacing = "_state" in self.__dict__ and state is not self._state
        self._state = state
        subscriptions.follow(getattr(state, "events", None))  # a model without events is repainted by its owner
        if replacing:
            self.state_replaced()

    def state_replaced(self) -> None:
        """After `state` changed to another object (not on the first assignment)."""


def docked_view_classes() -> list[type]:
    """Every StateView class that declares a Dock, once every module of gui/widgets is
    imported (a view's module registers it by being imported)."""
    import gui.widgets

    for module in pkgutil.iter_modules(gui.widgets.__path__):
        importlib.import_module(f"gui.widgets.{module.name}")
    return list(DOCKED)
