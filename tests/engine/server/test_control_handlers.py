"""Every control op declared in engine/wire/messages/control.py has exactly one handler among
the supervisor's parts, found by its name once at start; an op without one, or with two,
stops the supervisor from being built."""

from __future__ import annotations

import pytest

from engine.server.control_ops import _handlers
from engine.server.query_ops import QueryOps
from engine.server.submit_ops import SubmitOps
from engine.server.worker_ops import WorkerOps
from engine.wire.roles import CLIENT_OPS


def _parts():
    return SubmitOps(None), QueryOps(None, None), WorkerOps(None)  # type: ignore[arg-type]  # not called here


def test_every_declared_op_has_its_one_handler():
    handlers = _handlers(_parts())
    assert set(handlers) == set(CLIENT_OPS)
    assert handlers["submit"].__self__.__class__ is SubmitOps
    assert handlers["history"].__self__.__class__ is QueryOps
    assert handlers["reconfigure"].__self__.__class__ is WorkerOps


def test_an_op_with_no_handler_or_two_is_refused_at_start():
    class Twice:
        def status(self, call):
            return None

    with pytest.raises(RuntimeError, match="control op 'status' has 2 handlers"):
        _handlers((*_parts(), Twice()))
    with pytest.raises(RuntimeError, match="control op 'submit' has 0 handlers"):
        _handlers(_parts()[1:])
