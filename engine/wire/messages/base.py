"""The bases every wire message is built on, and the field types with their limits.

A message is a msgspec Struct whose tag is its op (`tag_field="op"`): its fields are the
header's keys, exactly as they go on the wire (`v` and `arrays` are the framing's, added and
taken off by engine/wire/protocol.py). Keys a reader does not know are ignored, as before.
Each class says, as ClassVars, which way it goes and what it is for.

Encoding (engine/wire/messages/codec.py): every field goes out, unless the struct is declared
`omit_defaults=True`, which is for messages whose senders leave some fields out: a field at
its default is then left off, and its reader takes the same default. Each class says
`kw_only=True` itself (msgspec does not pass it on to subclasses).
"""

from __future__ import annotations

import sys
from typing import Annotated, Any, ClassVar

import msgspec

# The limits a reader checks, declared where the field is.
NonNegative = Annotated[int, msgspec.Meta(ge=0)]
Finite = Annotated[float, msgspec.Meta(ge=-sys.float_info.max, le=sys.float_info.max)]  # no nan, no inf
Error = dict[str, Any]  # {"code": ..., "message": ...} as PageWardenError.to_wire() makes it


class WireMessage(msgspec.Struct, kw_only=True, tag_field="op", forbid_unknown_fields=False):
    """One op on the wire. `extra`, where a subclass declares it, holds the keys it does not
    name, flattened into the header on the wire (open payloads: alert fields, stats)."""

    direction: ClassVar[str]  # to_worker, to_supervisor, control or to_client
    description: ClassVar[str]  # one line: who sends it, what it carries


def op_of(message: WireMessage | type[WireMessage]) -> str:
    """The op a message (or message class) goes on the wire as: its tag."""
    tag = message.__struct_config__.tag
    if not isinstance(tag, str):
        raise TypeError(f"{message!r} declares no op (tag)")
    return tag


class WorkerCommand(WireMessage, kw_only=True):
    """Supervisor -> worker (the bus)."""

    direction: ClassVar[str] = "to_worker"
    roles: ClassVar[tuple[str, ...]] = ("prefill", "decode")  # the worker roles that take it


class WorkerReport(WireMessage, kw_only=True):
    """Worker -> supervisor (the bus)."""

    direction: ClassVar[str] = "to_supervisor"


class ControlCall(WireMessage, kw_only=True):
    """Client -> engine (the control socket). Answers and stream events carry its `id`."""

    direction: ClassVar[str] = "control"
    least_role: ClassVar[str]  # viewer, operator or admin (engine/wire/roles.py)
    answered_by: ClassVar[tuple[str, ...]] = ("supervisor",)  # and "agent": the vLLM agent answers it too

    id: Any = None  # echoed in every answer and stream event as it came, whatever its type


class ClientEvent(WireMessage, kw_only=True):
    """Engine -> client (the control socket): an answer or a submit's stream event."""

    direction: ClassVar[str] = "to_client"

    id: Any  # the call's, as it came
