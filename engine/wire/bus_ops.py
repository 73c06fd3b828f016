"""Every operation on the bus between the supervisor and its workers, by name and direction.

Derived from the typed messages (engine/wire/messages/to_worker.py and to_supervisor.py,
registered in engine/wire/messages/registry.py): adding an op is its struct there, its
sender and its handler. The supervisor sends only TO_WORKER ops and handles exactly
TO_SUPERVISOR ops (`WorkerEvents.on_<op>`); a worker sends only TO_SUPERVISOR ops
(`WorkerLoop.send`) and takes the TO_WORKER ops declared for its role (`on_<op>` in
engine/workers/). tests/engine/wire/test_bus_ops.py holds the handlers to these lists.
"""

from __future__ import annotations

from collections.abc import Collection

from engine.wire.messages.registry import BUS_TO_SUPERVISOR, BUS_TO_WORKER

TO_WORKER: dict[str, str] = BUS_TO_WORKER.descriptions()  # op -> what it asks, one line
TO_SUPERVISOR: dict[str, str] = BUS_TO_SUPERVISOR.descriptions()


def check_op(op: str, allowed: Collection[str], direction: str) -> None:
    """A send of an undeclared op is a programming error, found before it reaches the bus."""
    if op not in allowed:
        raise ValueError(f"bus op {op!r} is not declared {direction} in engine/wire/messages/")
