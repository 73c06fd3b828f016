"""Placement: which worker holds which request, written only here.

Two facts, one writer. A request's `decode_worker` and `prefill_worker` name the workers it
was placed on (they stay after it ends: its record and its `done` message say who served
it). A worker's `inflight` set names the requests it holds now (its batch slots, its
reservations): what dispatch counts against `max_batch`, what a drained worker waits for,
what fails when the worker goes. A request enters a worker's set when it is placed there
and leaves when the worker says it let go of it, when it ends, or when the worker goes.
"""

from __future__ import annotations

from engine.server.request_record import RequestRecord
from engine.server.worker_handle import WorkerHandle
from engine.server.worker_pool import WorkerPool


class Placement:
    def __init__(self, workers: WorkerPool):
        self.workers = workers

    def to_decode(self, rec: RequestRecord, worker: WorkerHandle) -> None:
        """rec reserves its pages on `worker`."""
        rec.decode_worker = worker.name
        worker.inflight.add(rec.request_id)

    def to_prefill(self, rec: RequestRecord, worker: WorkerHandle) -> None:
        """rec's prompt is computed on `worker`."""
        rec.prefill_worker = worker.name
        worker.inflight.add(rec.request_id)

    def unreserved(self, rec: RequestRecord, worker: WorkerHandle) -> None:
        """Its decode worker had no room: it goes back to the line, placed nowhere."""
        worker.inflight.discard(rec.request_id)
        rec.decode_worker = None

    def let_go(self, worker: WorkerHandle, request_id: str) -> None:
        """`worker` holds request_id no more (it said so: prefilled, released, finished...)."""
        worker.inflight.discard(request_id)

    def ended(self, rec: RequestRecord) -> None:
        """rec ended: no worker holds it for the supervisor any more."""
        for name in (rec.decode_worker, rec.prefill_worker):
            worker = self.workers.get(name)
            if worker is not None:
                worker.inflight.discard(rec.request_id)

    def take_all(self, worker: WorkerHandle) -> list[str]:
        """`worker` went: everything it held, which it holds no more."""
        held = list(worker.inflight)
        worker.inflight.clear()
        return held

    def decode_of(self, rec: RequestRecord) -> WorkerHandle | None:
        return self.workers.get(rec.decode_worker)

    def prefill_of(self, rec: RequestRecord) -> WorkerHandle | None:
        return self.workers.get(rec.prefill_worker)
