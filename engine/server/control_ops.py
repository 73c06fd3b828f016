"""ControlOps: who is asking (CURVE key or connection, and its role), whether its role may
send the op (engine/wire/roles.py), then the op's handler: SubmitOps (requests, canaries),
QueryOps (what a viewer reads), WorkerOps (what an admin does to the workers)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import zmq

from engine.errors import Forbidden
from engine.server.control_call import Call
from engine.server.query_ops import QueryOps
from engine.server.submit_ops import SubmitOps
from engine.server.worker_ops import WorkerOps
from engine.wire.protocol import Message, ProtocolError
from engine.wire.roles import CLIENT_OPS, OP_ROLES, allows

if TYPE_CHECKING:
    from engine.server.supervisor import Supervisor


class ControlOps:
    def __init__(self, sup: Supervisor):
        self.sup = sup
        self.submits, self.queries, self.worker_ops = SubmitOps(sup), QueryOps(sup, sup), WorkerOps(sup)
        self.handlers = _handlers((self.submits, self.queries, self.worker_ops))

    def handle(self, identity: bytes, msg: Message | None, frames: list[Any]) -> None:
        if msg is None:
            raise ProtocolError("empty message")
        op = msg.op
        if op not in CLIENT_OPS:
            raise ProtocolError(f"unknown op {op!r}; known: {', '.join(CLIENT_OPS)}")
        who, role = self._caller(identity, frames)
        if not allows(role, op):
            self.sup.counters["forbidden"] += 1
            raise Forbidden(f"op {op!r} needs the {OP_ROLES[op]} role; this client is a {role}")
        self.sup.counters[f"op:{op}"] += 1
        self.handlers[op](Call(identity, msg, who, role, self.sup.outbox, self.sup.counters))

    def _caller(self, identity: bytes, frames: list[Any]) -> tuple[str, str]:
        """(who, role) of the sender: its CURVE key and the role the allowlist gives it, or,
        without CURVE (loopback only), its connection and serve --local-role. Loopback clients
        share a role but not their requests: each connection owns what it submitted, as each
        has its own budget (a connection's ROUTER identity is the server's to give and stays
        its own while it is connected)."""
        sup = self.sup
        if sup.curve is None:
            return f"local:{identity.hex()}", sup.local_role
        try:
            user = frames[0].get("User-Id") if frames else None
        except (zmq.ZMQError, AttributeError, TypeError):
            user = None
        role = sup.curve.role_of(user)
        if role is None:
            raise Forbidden("this client's key is not in the allowlist any more (it was removed after it connected)")
        return user, role  # type: ignore[return-value]  # role_of() gives None without a User-Id


def _handlers(parts: tuple[object, ...]) -> dict[str, Callable[[Call], None]]:
    """op -> the method of that name of the one part that answers it: every declared op
    (engine/wire/messages/control.py) has exactly one, found once at start, never from a
    name a client sent."""
    handlers: dict[str, Callable[[Call], None]] = {}
    for op in CLIENT_OPS:
        owners = [getattr(part, op) for part in parts if inspect.ismethod(getattr(part, op, None))]
        if len(owners) != 1:
            raise RuntimeError(f"control op {op!r} has {len(owners)} handlers among "
                               f"{', '.join(type(p).__name__ for p in parts)}; it needs exactly one")
        handlers[op] = owners[0]
    return handlers
