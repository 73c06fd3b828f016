"""The bus operations are declared once (engine/wire/bus_ops.py): the supervisor's handlers are
exactly the declared worker-to-supervisor ops, every op a worker or the supervisor writes in
its source is declared in its direction, and an undeclared send fails before the bus."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine.server.worker_events import WorkerEvents
from engine.wire.bus_ops import TO_SUPERVISOR, TO_WORKER, check_op

ROOT = Path(__file__).resolve().parents[3]
OP_LITERAL = re.compile(r"""["']op["']: ["']([a-z_]+)["']""")


def ops_written_in(folder: str, calls: str) -> set[str]:
    """Ops in `{"op": ...}` literals on the lines of `folder` that call one of `calls`."""
    found = set()
    for path in (ROOT / folder).rglob("*.py"):
        for line in path.read_text().splitlines():
            if re.search(calls, line):
                found |= set(OP_LITERAL.findall(line))
    return found


def test_the_supervisor_handles_exactly_the_declared_worker_ops():
    handlers = {name.removeprefix("on_") for name in dir(WorkerEvents) if name.startswith("on_")}
    assert handlers == set(TO_SUPERVISOR)


def test_every_op_in_the_source_is_declared_in_its_direction():
    sent_by_workers = ops_written_in("engine/workers", r"\bsend\(")
    sent_by_supervisor = ops_written_in("engine/server", r"to_worker\(|broadcast\(")
    assert sent_by_workers and sent_by_workers <= set(TO_SUPERVISOR), sent_by_workers - set(TO_SUPERVISOR)
    assert sent_by_supervisor and sent_by_supervisor <= set(TO_WORKER), sent_by_supervisor - set(TO_WORKER)


def test_an_undeclared_send_fails_before_the_bus():
    check_op("reserve", TO_WORKER, "to a worker")
    with pytest.raises(ValueError, match=r"bus op 'reserved' is not declared to a worker"):
        check_op("reserved", TO_WORKER, "to a worker")
