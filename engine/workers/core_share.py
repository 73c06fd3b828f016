"""CoreShare: the CPU cores of one supervisor's worker processes, divided among those computing now.

Where the cores are shared (a CPU worker, `workers.threads` 0, a model `worth_sharing`), every
worker of a supervisor maps one small file in the run directory (`core-share`), a slot
per worker: the time (CLOCK_MONOTONIC, the same in every process) at which the worker last
computed, or 0 while it is idle. Before each layer of a forward pass a worker marks its slot
and sets its torch threads to its share of the cores: all of them while it computes alone, an
equal part while others compute too (the cores left over go to the lowest slots). So a decode
worker between admissions uses both cores of a 2-core machine (the 135M shape served at 16
concurrent: 1.47x the tokens/s of one thread per worker), and a prefill beside it takes half,
because the threads of all computing workers together must not outnumber the cores: OpenMP's
waiting threads would spin against each other.

Processes other than these workers are not in the file, and OpenMP suffers them badly: beside
one busy core, a decode step with two threads took 2.5x the time of one thread (a thread waits
at each op's end for its partner, which the busy process keeps off the CPU). So a worker also
watches its own CPU time while it computes with several threads (CrowdGauge): when the
process got much less than wall time x threads, another process holds cores it counts on, and
it computes with the cores it did get until a later probe finds them free again.

Sharing pays only for a model whose step is big enough (`worth_sharing`: its projection
weights total SHARE_MIN_BYTES or more). Served, the supervisor, the HTTP front and the clients
run at every token beside the workers. In process a second thread sped up even the default
copy model (2.4 MiB of weights: 1.05x at batch 1, 1.21x at 16); served it gained nothing
(shared against one thread per worker, the median round by case: 0.98-1.02x over 6
interleaved rounds, 0.94-0.98x in the 4 of them with 3 reps; 0.82-1.03x in an earlier
session). Served, by the size of the projection weights, the median round by case over 2-5
rounds: 3.1 and 6.1 MiB, 0.92-1.06x (a wash in this machine's noise); 12.2 MiB
(hidden 192, 8 layers), 0.99-1.23x; 22.8 MiB, 0.99-1.42x; 30 MiB and more, 1.07-1.64x
(bench/RESULTS.md, 2026-12-06). The 135M shape (513 MiB) gained 1.47x at 16 concurrent.
Those measurements predate the C++ module's OpenMP build: the attention kernels then ran on
one thread whatever the share, and only torch's own ops used more. Rechecked since for the
copy model's TTFT only (shared: 139 ms at 16 concurrent against 106 with one thread each).
A smaller model keeps one fixed part per worker, which also cannot collapse beside a foreign
process.

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
from torch import nn

from engine.model.cpu_linear import projection_weights
from engine.wire.protocol import HEARTBEAT_TIMEOUT_S

FILE_NAME = "core-share"
STALE_S = HEARTBEAT_TIMEOUT_S  # a mark this old is a worker that died or hung while computing
CHECK_S = 0.005  # the others' marks are read at most this often (a layer may take 50 us)
CROWDED = 0.85  # CPU time / (wall time x threads) below this: another process holds our cores
WINDOW_S = 0.25  # computing this long with the same threads (> 1) gives one reading
BACKOFF_S = (2.0, 32.0)  # a crowded reading caps the threads this long, doubled while it stays crowded
# a model shares the cores when its projection weights total at least this, counted as float32
# (measured so; a bfloat16 model of the same shape does the same work per step in more steps)
SHARE_MIN_BYTES = 8 << 20


def worth_sharing(model: nn.Module) -> bool:
    """Whether a step of this model is big enough to gain, served, from more threads than
    its worker's fixed part (measured; see the module docstring)."""
    return 4 * projection_weights(model) >= SHARE_MIN_BYTES


class CrowdGauge:
    """Whether processes this worker cannot see hold the cores it computes on: its CPU time
    against wall time x threads, over windows of WINDOW_S of computing. On 2 cores, threads
    that all run give 0.99; beside one busy process, 0.61-0.65."""

    def __init__(self, cpu_time: Callable[[], float] = time.process_time):
        self._cpu_time = cpu_time
        self.cap: int | None = None  # at most this many threads until `until`
        self.until = -math.inf
        self.backoff = BACKOFF_S[0]
        self._window: tuple[float, float, int] | None = None  # (wall, cpu, threads) at its start

    def limit(self, now: float, share: int) -> int:
        if self.cap is not None and now >= self.until:
            self.cap = None  # probe the whole share again
        return share if self.cap is None else min(share, self.cap)

    def observe(self, now: float, threads: int) -> None:
        """At a check while computing with `threads`."""
        if threads <= 1:  # one thread waits for nobody
            self._window = None
            return
        cpu = self._cpu_time()
        if self._window is None or self._window[2] != threads:
            self._window = (now, cpu, threads)
            return
        wall = now - self._window[0]
        if wall < WINDOW_S:
            return
        used = (cpu - self._window[1]) / wall  # cores this process got
        self._window = (now, cpu, threads)
        if used < CROWDED * threads:
            self.cap, self.until = max(1, int(used)), now + self.backoff
            self.backoff = min(2 * self.backoff, BACKOFF_S[1])
        elif self.cap is None:
            self.backoff = BACKOFF_S[0]

    def pause(self) -> None:
        """Idle: wall time without computing is no reading."""
        self._window = None


class CoreShare:
    def __init__(self, run_dir: str | Path, slot: int, slots: int, cores: int,
                 set_threads: Callable[[int], None] = torch.set_num_threads,
                 cpu_time: Callable[[], float] = time.process_time):
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
        self.crowd = CrowdGauge(cpu_time)
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
            self.crowd.observe(now, self.threads)
            threads = self.crowd.limit(now, self.share(now))
            if threads != self.threads:
                self._set_threads(threads)
                self.threads = threads
        return self.threads

    def idle(self) -> None:
        """This worker computes nothing until its next mark: the others may have its cores."""
        self._marks[self.slot] = 0.0
        self.crowd.pause()

    def close(self) -> None:
        if self._map.closed:
            return
        self.idle()
        del self._marks  # the map cannot close while a view of it lives
        self._map.close()
