"""Which ops go which way: one registry per direction, built from the message modules.

engine/wire/bus_ops.py and engine/wire/roles.py derive their lists from these; `read`
(engine/wire/messages/codec.py) looks an incoming op up here, and `handler_table`
(engine/wire/messages/dispatch.py) finds each op's handler from here.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Generic, TypeVar

import msgspec

from engine.wire.messages import control, to_client, to_supervisor, to_worker
from engine.wire.messages.base import ClientEvent, ControlCall, WireMessage, WorkerCommand, WorkerReport, op_of

M = TypeVar("M", bound=WireMessage)


class Registry(Generic[M]):
    """The messages of one direction, by op."""

    def __init__(self, direction: str, reader: str, messages: Sequence[type[M]]):
        self.direction = direction
        self.reader = reader  # who reads them, for errors: "a worker", "the control socket", ...
        self.ops: dict[str, type[M]] = {}
        # what read() needs of each class, worked out once: its declared fields, whether it is open
        self.fields: dict[type[M], frozenset[str]] = {}
        self.optional: dict[type[M], frozenset[str]] = {}  # the fields with a default
        self.open: frozenset[type[M]] = frozenset(cls for cls in messages if "extra" in cls.__struct_fields__)
        for cls in messages:
            op = op_of(cls)
            if cls.direction != direction:
                raise TypeError(f"{cls.__qualname__} (op {op!r}) goes {cls.direction}, not {direction}")
            if op in self.ops:
                raise TypeError(f"op {op!r} is declared twice {direction}: {self.ops[op].__qualname__}, "
                                f"{cls.__qualname__}")
            self.ops[op] = cls
            self.fields[cls] = frozenset(cls.__struct_fields__)
            self.optional[cls] = frozenset(f.name for f in msgspec.structs.fields(cls) if not f.required)

    def __contains__(self, op: object) -> bool:
        return op in self.ops

    def __iter__(self) -> Iterator[str]:
        return iter(self.ops)

    def __len__(self) -> int:
        return len(self.ops)

    def __getitem__(self, op: str) -> type[M]:
        return self.ops[op]

    def declares(self, cls: type) -> bool:
        """Whether `cls` is one of this direction's messages (not merely one of the same op)."""
        return cls in self.fields

    def descriptions(self) -> dict[str, str]:
        """op -> its one-line description."""
        return {op: cls.description for op, cls in self.ops.items()}


BUS_TO_WORKER: Registry[WorkerCommand] = Registry("to_worker", "a worker", to_worker.ALL)
BUS_TO_SUPERVISOR: Registry[WorkerReport] = Registry("to_supervisor", "the supervisor", to_supervisor.ALL)
CONTROL: Registry[ControlCall] = Registry("control", "the control socket", control.ALL)
TO_CLIENT: Registry[ClientEvent] = Registry("to_client", "a client", to_client.ALL)
