"""Call: one client message being answered: who sent it, with which role, and the way back."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from engine.errors import Forbidden
from engine.server.outbox import Outbox
from engine.server.request_record import RequestRecord
from engine.wire.messages.base import ControlCall
from engine.wire.messages.codec import read
from engine.wire.messages.registry import CONTROL
from engine.wire.protocol import MAX_CONTROL_FRAME, Message, error_reply, reply

C = TypeVar("C", bound=ControlCall)


@dataclass
class Call:
    identity: bytes  # the client's ROUTER identity
    msg: Message
    who: str  # its CURVE key, or "local:<connection>" without CURVE (engine/wire/roles.py)
    role: str
    outbox: Outbox
    counters: Counter[str]

    @property
    def msg_id(self) -> Any:
        return self.msg.get("id")

    def read(self, cls: type[C]) -> C:
        """The message as its op's typed message (engine/wire/messages/control.py). Raises
        ProtocolError naming the field, its value and what was expected."""
        message = read(self.msg, CONTROL)
        if not isinstance(message, cls):  # a handler asked for another op's message: a bug of ours
            raise TypeError(f"op {self.msg.op!r} does not read as {cls.__qualname__}")
        return message

    def reply(self, result: dict[str, Any] | None = None, arrays: dict[str, np.ndarray] | None = None) -> None:
        """The answer; one over the control frame limit becomes `answer_too_large` (the client
        would drop it unseen and wait for its timeout)."""
        frames = reply(self.msg_id, result, arrays)
        size = max(len(f) for f in frames)
        if size > MAX_CONTROL_FRAME:
            self.counters["answers_too_large"] += 1
            frames = error_reply(self.msg_id, "answer_too_large",
                                 f"the answer to {self.msg.op!r} would be {size:,} bytes in one frame; the limit is "
                                 f"{MAX_CONTROL_FRAME:,}: ask for a shorter window or page through it")
        self.outbox.to_client(self.identity, frames)

    def error(self, code: str, message: str) -> None:
        self.outbox.to_client(self.identity, error_reply(self.msg_id, code, message))

    def own(self, rec: RequestRecord, what: str) -> None:
        """Only the client that submitted a request (or an admin) may act on it."""
        self.may_act_for(rec.owner, rec.request_id, what)

    def may_act_for(self, owner: str, request_id: str, what: str) -> None:
        if owner != self.who and self.role != "admin":
            self.counters["forbidden"] += 1
            raise Forbidden(f"request {request_id} belongs to another client; only it or an admin may {what} it")
