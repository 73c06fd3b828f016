"""WorkerOps: what an admin may do to the workers: start, stop, restart, reconfigure."""

from __future__ import annotations

from typing import Protocol

from engine.errors import InvalidRequest
from engine.server.alert_forward import shown_changes
from engine.server.audit import AuditLog
from engine.server.control_call import Call
from engine.server.reconfigure import Reconfigure
from engine.server.worker_handle import WorkerHandle
from engine.server.worker_pool import WorkerPool
from engine.wire.messages import control
from engine.wire.states import WorkerState


class ManagedEngine(Protocol):
    """What managing workers needs of the supervisor, and no more."""

    workers: WorkerPool
    audit: AuditLog
    reconfigure: Reconfigure


class WorkerOps:
    def __init__(self, engine: ManagedEngine):
        self.engine = engine

    def _worker(self, call: Call, op: type[control.Start] | type[control.Stop] | type[control.Restart]) -> WorkerHandle:
        name = call.read(op).worker
        worker = self.engine.workers.get(name)
        if worker is None:
            raise InvalidRequest(f"no worker named {name!r}; workers: {', '.join(self.engine.workers)}")
        return worker

    def start(self, call: Call) -> None:
        worker = self._worker(call, control.Start)
        if worker.state not in (WorkerState.STOPPED, WorkerState.CRASHED):
            raise InvalidRequest(f"worker {worker.name} is {worker.state.value}; only a stopped or crashed worker can start")
        self.engine.workers.spawn(worker)
        call.reply(worker.describe())

    def stop(self, call: Call) -> None:
        worker = self._worker(call, control.Stop)
        if worker.state in (WorkerState.STOPPED, WorkerState.CRASHED, WorkerState.STOPPING):
            raise InvalidRequest(f"worker {worker.name} is already {worker.state.value}")
        self.engine.workers.stop(worker)
        call.reply(worker.describe())

    def restart(self, call: Call) -> None:
        worker = self._worker(call, control.Restart)
        self.engine.workers.stop(worker, restart=True)
        call.reply(worker.describe())

    def reconfigure(self, call: Call) -> None:
        """Validate first and report the capacity consequence; apply only when asked."""
        asked = call.read(control.Reconfigure)
        changes, apply = asked.changes, asked.apply
        if apply:  # who asked for what, before it is applied or refused
            self.engine.audit.record("engine", "reconfigure_requested", by=call.who, role=call.role,
                                     changes=shown_changes(changes))
        call.reply(self.engine.reconfigure(changes, apply=apply))
