"""Selection: the one selected request of a window, which every view reads and follows.

It holds the request id and the slot its pages carry (either may be None: a click on a
page whose request is not known yet selects the slot alone). Views change it through
`select` and follow its `changed` emitter (EngineState's `events.selection`), emitted at
once: a selection is not telemetry, it repaints now, not at the next frame. Qt-free.
"""

from __future__ import annotations

from gui.model.events import EventEmitter, Events


class Selection:
    def __init__(self, changed: EventEmitter | None = None):
        self.request_id: str | None = None
        self.slot: int | None = None
        self.changed = changed if changed is not None else Events("changed").changed

    def select(self, request_id: str | None, slot: int | None) -> bool:
        """Select a request and its slot (None, None clears); True if anything changed."""
        request_id = request_id or None
        slot = None if slot is None else int(slot)
        if (request_id, slot) == (self.request_id, self.slot):
            return False
        self.request_id, self.slot = request_id, slot
        self.changed.emit()
        return True

    def clear(self) -> bool:
        return self.select(None, None)

    def __repr__(self) -> str:
        return f"<Selection request={self.request_id!r} slot={self.slot!r}>"
