"""Events: named change notifications from a Qt-free model to whatever views follow it.

A model declares its kinds of change once (`Events("pages", "requests", ...)`); a view
connects a callback to the ones it shows (`state.events.requests.connect(self.refresh)`),
and the model never knows a view exists. Callbacks take no arguments: they read the model.

`emit()` calls the callbacks now. `mark()` only notes the change; `flush()` (the window's
repaint timer) then calls each callback of every marked kind once, however many kinds and
messages it covered, so telemetry at any rate repaints each view at most once a frame.
"""

from __future__ import annotations

from collections.abc import Callable

Callback = Callable[[], object]


class EventEmitter:
    """One kind of change of one model."""

    def __init__(self, name: str, group: Events):
        self.name = name
        self._group = group
        self.callbacks: list[Callback] = []

    def connect(self, callback: Callback) -> Callback:
        """Call `callback()` on this change (once, however often it is connected)."""
        if callback not in self.callbacks:
            self.callbacks.append(callback)
        return callback

    def disconnect(self, callback: Callback) -> None:
        """Stop calling `callback`; no error when it was not connected."""
        if callback in self.callbacks:
            self.callbacks.remove(callback)

    def emit(self) -> None:
        """Call every callback now."""
        _call_all(list(self.callbacks))

    def mark(self) -> None:
        """Note the change for the next `Events.flush()`."""
        self._group.mark(self.name)

    def __repr__(self) -> str:
        return f"<EventEmitter {self.name}: {len(self.callbacks)} callback(s)>"


class Events:
    """The emitters of one model, as attributes (`events.pages`); an unknown name raises
    AttributeError, so a view cannot connect to a change the model never reports.

    `families` are name prefixes whose members are declared on first use (`topic:` +
    any telemetry topic): a view can follow a topic before its first message arrives."""

    def __init__(self, *names: str, families: tuple[str, ...] = ()):
        self.names = tuple(names)
        self.families = tuple(families)
        self._emitters = {name: EventEmitter(name, self) for name in names}
        self._pending: dict[str, None] = {}  # marked since the last flush, in marking order

    def __getattr__(self, name: str) -> EventEmitter:
        try:
            emitters, families = self.__dict__["_emitters"], self.__dict__["families"]
            if name not in emitters and name.startswith(families):
                self._declare(name)
            return emitters[name]
        except KeyError:
            names = ", ".join(self.__dict__.get("names", ()))
            raise AttributeError(f"no event {name!r}; this model reports {names}") from None

    def _declare(self, name: str) -> None:
        self._emitters[name] = EventEmitter(name, self)
        self.names += (name,)

    def __getitem__(self, name: str) -> EventEmitter:
        return getattr(self, name)

    def mark(self, *names: str) -> None:
        """Note changes for the next flush; raises KeyError for an undeclared name."""
        for name in names:
            if name not in self._emitters and name.startswith(self.families):
                self._declare(name)
            if name not in self._emitters:
                raise KeyError(f"no event {name!r}; this model reports {', '.join(self.names)}")
            self._pending[name] = None

    def mark_all(self) -> None:
        self.mark(*self.names)

    @property
    def pending(self) -> tuple[str, ...]:
        return tuple(self._pending)

    def flush(self) -> None:
        """Call each callback of the marked kinds once (in connection order), then forget the
        marks. A callback that raises does not keep the others from running; the first error
        is raised after all ran."""
        names, self._pending = self._pending, {}
        callbacks = dict.fromkeys(cb for name in names for cb in self._emitters[name].callbacks)
        _call_all(list(callbacks))


class Subscriptions:
    """What one view follows: {event name: callback}. `follow(events)` disconnects them from
    the model it followed before and connects them to this one (a new engine, a snapshot)."""

    def __init__(self, **callbacks: Callback):
        self.callbacks = callbacks
        self.events: Events | None = None

    def follow(self, events: Events | None) -> None:
        if self.events is not None:
            for name, callback in self.callbacks.items():
                self.events[name].disconnect(callback)
        self.events = events
        if events is not None:
            for name, callback in self.callbacks.items():
                events[name].connect(callback)


def _call_all(callbacks: list[Callback]) -> None:
    error = None
    for callback in callbacks:
        try:
            callback()
        except Exception as exc:  # noqa: BLE001 - raised again below, after the others ran
            error = error or exc
    if error is not None:
        raise error
