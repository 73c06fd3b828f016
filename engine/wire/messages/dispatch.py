"""Each op to its handler: the method `<prefix><op>` of a handling class, looked up from a
registry once (never from a name a peer sent)."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, TypeVar

from engine.wire.messages.base import WireMessage, op_of
from engine.wire.messages.registry import Registry

M = TypeVar("M", bound=WireMessage)


def handler_table(owner: object, registry: Registry[M], *, takes: Callable[[type[M]], bool] = lambda cls: True,
                  prefix: str = "on_", not_ops: Collection[str] = ()) -> dict[type[M], Callable[..., Any]]:
    """message class -> `owner`'s handler for it, for each op of `registry` that `takes` says
    the owner takes. Raises TypeError when the owner lacks the handler of an op it takes, has
    one for an op it does not take, or has a `<prefix>` method for no declared op (other than
    `not_ops`, hooks of its own)."""
    name = getattr(owner, "__qualname__", type(owner).__qualname__)
    table: dict[type[M], Callable[..., Any]] = {}
    for op, cls in registry.ops.items():
        handler = getattr(owner, prefix + op, None)
        if takes(cls) and handler is None:
            raise TypeError(f"{name} takes op {op!r} ({registry.direction}) but has no {prefix}{op}")
        if not takes(cls) and handler is not None:
            raise TypeError(f"{name} has {prefix}{op}, but op {op!r} is not one it takes ({registry.direction})")
        if handler is not None:
            table[cls] = handler
    strays = {attr for attr in dir(owner) if attr.startswith(prefix)} - {prefix + op_of(c) for c in table} - set(not_ops)
    if strays:
        raise TypeError(f"{name}: {', '.join(sorted(strays))} handle(s) no op declared {registry.direction} "
                        f"(engine/wire/messages/)")
    return table
