"""CoreShare: the CPU cores of one supervisor's worker processes, divided among those computing now.

Every worker of a supervisor maps one small file in the run directory (`core-share`), a slot
per worker: the time (CLOCK_MONOTONIC, the same in every process) at which the worker last
computed, or 0 while it is idle. Before each layer of a forward pass a worker marks its slot
and sets its torch threads to its share of the cores: all of them while it computes alone, an
equal part while others compute too (the cores left over go to the lowest slots). So a decode
worker between admissions uses both cores of a 2-core machine (the 135M shape served at 16
concurrent: 1.47x the tokens/s of one thread per worker), and a prefill beside it takes half,
because the threads of all computing workers together must not outnumber the cores: OpenMP's
waiting threads would spin against each other.

A mark stays until the worker goes idle, however long its layer (a prefill layer of 4,096
tokens can take seconds); one older than the supervisor's heartbeat timeout is not counted,
so a worker that died or hung while computing gives its share back (a hung one is killed by
then, and a restarted one clears its slot at start). The marks only steer speed: a wrong or
torn read costs threads, never data.
"""

from __future__ import annotations

import math
import mmap
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from engine.server.worker_pool import HEARTBEAT_TIMEOUT_S

FILE_NAME = "core-share"
STALE_S = HEARTBEAT_TIMEOUT_S  # a mark this old is a worker that died or hung while computing
CHECK_S = 0.005  # the others' marks are read at most this often (a layer may take 50 us)


class CoreShare:
    def __init__(self, run_dir: str | Path, slot: int, slots: int, cores: int,
                 set_threads: Callable[[int], None] = torch.set_num_threads):
        if not 0 <= slot < slots:
            raise ValueError(f"core-share slot {slot} is out of range: must be between 0 and {slots - 1}")
        if cores < 1:
            raise ValueError(f"core-share cores {cores} must be at least 1")
        self.slot, self.cores = slot, cores
        self._set_threads = set_threads
        fd = os.open(Path(run_dir) / FILE_NAME, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < slots * 8:  # every worker asks for the same size: it never shrinks
                os.ftruncate(fd, slots * 8)
            self._map = mmap.mmap(fd, slots * 8)
        finally:
            os.close(fd)
        self._marks = np.frombuffer(self._map, dtype=np.float64)
        self._marks[slot] = 0.0  # a worker restarted in this slot: the one before may have died computing
        self.threads = 0  # what this worker last set (0: not yet)
        self._checked = -math.inf

    def _computing(self, now: float) -> np.ndarray:
        marks = self._marks.copy()
        marks[self.slot] = 0.0
        return (marks > 0.0) & (now - marks < STALE_S)

    def others_computing(self, now: float) -> int:
        """How many other workers marked their slot within STALE_S of `now` and are not idle."""
        return int(np.count_nonzero(self._computing(now)))

    def share(self, now: float) -> int:
        """cores // n for each of the n computing workers; the cores left over go one each to
        the lowest slots (3 cores, 2 workers: 2 and 1)."""
        computing = self._computing(now)
        n = 1 + int(np.count_nonzero(computing))
        below = int(np.count_nonzero(computing[: self.slot]))
        return max(1, self.cores // n + (1 if below < self.cores % n else 0))

    def computing(self, now: float | None = None) -> int:
        """Mark this worker as computing and take its share of the cores; the threads it has."""
        now = time.monotonic() if now is None else now
        self._marks[self.slot] = now
        if now - self._checked >= CHECK_S:
            self._checked = now
            threads = self.share(now)
            if threads != self.threads:
                self._set_threads(threads)
                self.threads = threads
        return self.threads

    def idle(self) -> None:
        """This worker computes nothing until its next mark: the others may have its cores."""
        self._marks[self.slot] = 0.0

    def close(self) -> None:
        if self._map.closed:
            return
        self.idle()
        del self._marks  # the map cannot close while a view of it lives
        self._map.close()
