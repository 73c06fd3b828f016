"""The bus operations are declared once, as typed messages (engine/wire/messages/): the
supervisor's handlers are exactly the declared worker-to-supervisor ops, each worker role
handles exactly the supervisor-to-worker ops declared for it, every op a worker or the
supervisor sends in its source is declared in its direction, and an undeclared send fails
before the bus."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine.server.worker_events import WorkerEvents
from engine.wire.bus_ops import TO_SUPERVISOR, TO_WORKER, check_op
from engine.wire.messages import to_supervisor, to_worker
from engine.wire.messages.base import op_of
from engine.wire.messages.dispatch import handler_table
from engine.wire.messages.registry import BUS_TO_SUPERVISOR, BUS_TO_WORKER
from engine.wire.protocol import Message, ProtocolError
from engine.workers.decode import DecodeWorker
from engine.workers.prefill import PrefillWorker

ROOT = Path(__file__).resolve().parents[3]
OP_LITERAL = re.compile(r"""["']op["']: ["']([a-z_]+)["']""")
REPORT_BUILT = re.compile(r"\breport\.([A-Z]\w*)\(")  # engine/workers: `from ... import to_supervisor as report`
ROLES = {"prefill": PrefillWorker, "decode": DecodeWorker}


def lines_calling(folder: str, calls: str) -> list[str]:
    return [line for path in (ROOT / folder).rglob("*.py") for line in path.read_text().splitlines()
            if re.search(calls, line)]


def ops_written_in(folder: str, calls: str) -> set[str]:
    """Ops in `{"op": ...}` literals on the lines of `folder` that call one of `calls`."""
    return {op for line in lines_calling(folder, calls) for op in OP_LITERAL.findall(line)}


def test_the_lists_are_the_registries():
    assert list(TO_WORKER) == list(BUS_TO_WORKER) and list(TO_SUPERVISOR) == list(BUS_TO_SUPERVISOR)
    assert all(TO_WORKER.values()) and all(TO_SUPERVISOR.values())  # each says what it is for


def test_the_supervisor_handles_exactly_the_declared_worker_ops():
    handlers = {name.removeprefix("on_") for name in dir(WorkerEvents) if name.startswith("on_")}
    assert handlers == set(TO_SUPERVISOR)
    assert len(handler_table(WorkerEvents, BUS_TO_SUPERVISOR)) == len(BUS_TO_SUPERVISOR)


def test_each_role_handles_exactly_the_ops_declared_for_it():
    for role, worker in ROLES.items():
        declared = {op for op, cls in BUS_TO_WORKER.ops.items() if role in cls.roles}
        assert {op_of(cls) for cls in worker.handlers} == declared, role
        assert all(worker.handlers[cls] is getattr(worker, f"on_{op_of(cls)}") for cls in worker.handlers)
    taken = {op for cls in BUS_TO_WORKER.ops.values() for op in [op_of(cls)] if set(cls.roles) & set(ROLES)}
    assert taken == set(TO_WORKER)  # no op is declared for a role that does not exist


def test_a_role_with_a_handler_too_many_or_too_few_is_refused_when_defined():
    with pytest.raises(TypeError, match=r"has on_reserve, but op 'reserve' is not one it takes"):
        type("Wrong", (PrefillWorker,), {"on_reserve": lambda self, cmd: None})
    with pytest.raises(TypeError, match=r"takes op 'cancel' \(to_worker\) but has no on_cancel"):
        type("Lacking", (PrefillWorker,), {"on_cancel": None})
    with pytest.raises(TypeError, match=r"on_defrag handle\(s\) no op declared to_worker"):
        type("Stray", (PrefillWorker,), {"on_defrag": lambda self, cmd: None})


def test_an_op_for_another_role_is_refused_by_name():
    prefill = SimpleNamespace(role="prefill", name="prefill-0", handlers=PrefillWorker.handlers)
    reserve = Message({"op": "reserve", "request_id": "r1", "slot": 1, "prompt_ids": [1]})
    with pytest.raises(ProtocolError, match=r"prefill worker prefill-0 does not take bus op 'reserve': it is "
                                            r"declared for decode workers"):
        PrefillWorker.handle(prefill, reserve)  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match=r"unknown op 'defrag' for a worker; known: reserve, prefill"):
        PrefillWorker.handle(prefill, Message({"op": "defrag"}))  # type: ignore[arg-type]


def test_every_op_in_the_source_is_declared_in_its_direction():
    # a worker builds its reports as structs; no dict literal is sent any more
    built = {name for line in lines_calling("engine/workers", r"\bsend\(|report\.") for name in REPORT_BUILT.findall(line)}
    report_classes = {cls.__name__ for cls in BUS_TO_SUPERVISOR.ops.values()} | {"PoolInfo"}
    assert built and built <= report_classes, built - report_classes
    assert not ops_written_in("engine/workers", r"\bsend\(")
    assert {op_of(getattr(to_supervisor, name)) for name in built - {"PoolInfo"}} <= set(TO_SUPERVISOR)
    # the supervisor: dict literals today (structs of engine/wire/messages/to_worker.py once converted)
    sent_by_supervisor = ops_written_in("engine/server", r"to_worker\(|broadcast\(|_send\(")
    built_by_supervisor = {name for line in lines_calling("engine/server", r"to_worker\(|broadcast\(|_send\(")
                           for name in re.findall(r"\bto_worker\.([A-Z]\w*)\(", line)}
    assert sent_by_supervisor or built_by_supervisor
    assert sent_by_supervisor <= set(TO_WORKER), sent_by_supervisor - set(TO_WORKER)
    assert all(hasattr(to_worker, name) for name in built_by_supervisor), built_by_supervisor


def test_an_undeclared_send_fails_before_the_bus():
    check_op("reserve", TO_WORKER, "to a worker")
    with pytest.raises(ValueError, match=r"bus op 'reserved' is not declared to a worker"):
        check_op("reserved", TO_WORKER, "to a worker")
    worker = SimpleNamespace(bus=None)
    with pytest.raises(ValueError, match=r"Reserve is not a bus op declared to the supervisor"):
        PrefillWorker.send(worker, to_worker.Reserve(request_id="r", slot=1, prompt_ids=[1]))  # type: ignore[arg-type]
