"""StateView: a view that shows one EngineState and repaints on the changes it names.

A view lists its subscriptions in `follows()` ({event name: callback}, names from
`EngineState.EVENTS`); assigning `view.state = other` moves them to the other state (a new
engine, a snapshot). The window finds every StateView among its children and hands each
(unless `shows_window_state` is False) the new state: adding a view needs no change to the window's refresh.
"""

from __future__ import annotations

from collections.abc import Callable

from gui.model.engine_state import EngineState
from gui.model.events import Subscriptions


class StateView:
    shows_window_state = True  # False: a view of another model (the window leaves it alone)

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
