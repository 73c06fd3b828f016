"""Outbox: every message the supervisor sends, to a client or to a worker, goes through here."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import zmq

from engine.server.worker_handle import WorkerHandle
from engine.server.worker_pool import WorkerPool
from engine.wire.messages.base import ClientEvent, WorkerCommand
from engine.wire.messages.codec import header_of
from engine.wire.messages.registry import BUS_TO_WORKER
from engine.wire.protocol import pack
from engine.wire.states import WorkerState


class Outbox:
    def __init__(self, control: zmq.Socket[bytes], bus: zmq.Socket[bytes], workers: WorkerPool):
        self.control, self.bus, self.workers = control, bus, workers

    def to_client(self, identity: bytes, frames: Sequence[Any]) -> None:
        self.control.send_multipart([identity, *frames], copy=False)

    def event(self, identity: bytes, message: ClientEvent, arrays: dict[str, np.ndarray] | None = None) -> None:
        """An answer or stream event (engine/wire/messages/to_client.py) to a client."""
        self.to_client(identity, pack(header_of(message), arrays))

    def to_worker(self, worker: WorkerHandle, message: WorkerCommand,
                  arrays: dict[str, np.ndarray] | None = None) -> None:
        """A bus command declared to workers (engine/wire/messages/to_worker.py); any other
        message is refused before the bus."""
        if not BUS_TO_WORKER.declares(type(message)):
            raise TypeError(f"{type(message).__qualname__} is not a command to a worker (engine/wire/messages/)")
        self.bus.send_multipart([worker.identity, *pack(header_of(message), arrays)], copy=False)

    def to_live_worker(self, worker: WorkerHandle | None, message: WorkerCommand) -> None:
        """To a worker whose process runs; nothing when it is gone (nothing could arrive)."""
        if worker is not None and self.workers.alive(worker):
            self.to_worker(worker, message)

    def broadcast(self, message: WorkerCommand) -> None:
        """To every worker that listens: ready or draining."""
        for worker in self.workers.values():
            if worker.state in (WorkerState.READY, WorkerState.DRAINING):
                self.to_worker(worker, message)
