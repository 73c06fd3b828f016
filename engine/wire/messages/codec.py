"""Headers in and out: `read` turns a received header into its typed message, `header_of`
turns a message into the header protocol.pack sends. Arrays stay beside, in Message.arrays."""

from __future__ import annotations

import functools
import math
import re
import reprlib
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

import msgspec

from engine.wire.messages.base import WireMessage, op_of
from engine.wire.messages.registry import Registry
from engine.wire.protocol import Message, ProtocolError

M = TypeVar("M", bound=WireMessage)

_KEEP = (bytes, bytearray, memoryview)  # msgpack packs these as bin; to_builtins would make base64 text
_STEP = re.compile(r"\.(\w+)|\[(\d+)\]|\[\.\.\.\]")
_MISSING = re.compile(r"Object missing required field `(.+)`")
_SHORT = reprlib.Repr()
_SHORT.maxstring, _SHORT.maxother, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxlevel = 60, 60, 8, 4, 3


def read(msg: Message | Mapping[str, Any], registry: Registry[M]) -> M:
    """The typed message of a received header (a Message's, or a header map).

    A field with a default that is null reads as one left out, as field_of read it; keys a
    message does not declare are ignored, or kept in `extra` where it has one. Raises
    ProtocolError naming an unknown op and the known ones, or the field, its value and what
    was expected."""
    header = msg.header if isinstance(msg, Message) else msg
    op = header.get("op")
    cls = registry.ops.get(op)  # type: ignore[arg-type]  # any key: an unknown one is refused below
    if cls is None:
        raise ProtocolError(f"unknown op {op!r} for {registry.reader}; known: {', '.join(registry.ops)}")
    source = header
    optional = registry.optional[cls]
    if cls in registry.open:
        source = {k: v for k, v in header.items() if k != "extra" and not (v is None and k in optional)}
    elif None in header.values():
        source = {k: v for k, v in header.items() if not (v is None and k in optional)}
    try:
        message = msgspec.convert(source, cls)
    except msgspec.ValidationError as exc:
        raise ProtocolError(explain(exc, header)) from None
    if cls in registry.open:
        declared = registry.fields[cls]
        message.extra = {k: v for k, v in header.items()  # type: ignore[attr-defined]  # open: it has one
                         if k not in declared and k != "op" and k != "v"}
    return message


def header_of(message: WireMessage) -> dict[str, Any]:
    """The header map of `message`, for protocol.pack: `op` and its fields (a field at its
    default left off where the class says omit_defaults), `extra` flattened in. Shallow: the
    values go to msgpack as they are, as a dict sender's did. Raises ValueError when an
    `extra` key is also a declared field."""
    op, defaults, nested = _plan(type(message))
    header: dict[str, Any] = {"op": op, **msgspec.structs.asdict(message)}
    for name, default in defaults.items():
        if header[name] == default:
            del header[name]
    for name in nested:  # a part that is a Struct itself (a hello's pool, a prefill's target)
        if name in header:
            header[name] = msgspec.to_builtins(header[name], builtin_types=_KEEP)
    extra = header.pop("extra", None)
    if extra:
        clash = extra.keys() & header.keys()
        if clash:
            raise ValueError(f"{type(message).__qualname__}: extra field(s) {sorted(clash)} are declared fields")
        header.update(extra)
    return header


@functools.cache
def _plan(cls: type[WireMessage]) -> tuple[str, dict[str, Any], tuple[str, ...]]:
    """What header_of needs of a message class: its op, the defaults of the fields left off at
    their default, and the fields whose type holds a Struct."""
    defaults: dict[str, Any] = {}
    fields = msgspec.structs.fields(cls)
    if cls.__struct_config__.omit_defaults:
        for field in fields:
            if field.default is not msgspec.NODEFAULT:
                defaults[field.name] = field.default
            elif field.default_factory is not msgspec.NODEFAULT:
                defaults[field.name] = field.default_factory()
    return op_of(cls), defaults, tuple(f.name for f in fields if _holds_struct(f.type))


def _holds_struct(tp: Any) -> bool:
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return True
    return any(_holds_struct(arg) for arg in typing.get_args(tp))


def open_message(cls: type[M], fields: Mapping[str, Any]) -> M:
    """A message of an open class (one with `extra`): the fields it declares as such, the
    others in `extra`."""
    declared = cls.__struct_fields__
    named = {k: v for k, v in fields.items() if k in declared}
    rest = {k: v for k, v in fields.items() if k not in declared}
    return cls(**named, extra=rest)


def explain(exc: msgspec.ValidationError, header: Mapping[str, Any]) -> str:
    """msgspec's complaint as the field, its value and what was expected."""
    expected, _, where = str(exc).partition(" - at `")
    if where.startswith("key` in `"):  # a map key of the wrong type
        where, expected = where.removeprefix("key` in `"), f"{expected} (a key)"
    path = where.rstrip("`") or "$"
    name = path[2:]  # "$.items[0][1]" -> "items[0][1]"
    missing = _MISSING.fullmatch(expected)
    if missing:
        return f"field '{f'{name}.' if name else ''}{missing.group(1)}' is required"
    value = _at(header, path)
    if isinstance(value, float) and not math.isfinite(value):
        expected = "Expected a finite number"
    return f"field '{name}' = {short(value)}: {expected}"


def short(value: Any) -> str:
    """A repr of at most 80 characters, cheap for a long list."""
    text = _SHORT.repr(value)
    return text if len(text) < 80 else text[:77] + "..."


def _at(header: Mapping[str, Any], path: str) -> Any:
    """The value msgspec's path names ("$.target.endpoint", "$.items[0][1]"); a dict key it
    does not name ("[...]") stops the walk at the dict."""
    value: Any = header
    for step in _STEP.finditer(path):
        key, index = step.groups()
        try:
            if key is not None:
                value = value[key]
            elif index is not None:
                value = value[int(index)]
            else:
                break
        except (KeyError, IndexError, TypeError):
            break
    return value
