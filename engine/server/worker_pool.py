"""WorkerPool: the worker processes, and the one place a worker's state changes.

    STOPPED/CRASHED -> STARTING (spawn) -> READY (a valid hello) -> DRAINING (reconfigure:
    no new requests; restarts when its last one ends) -> STOPPING (asked to shut down) ->
    STOPPED; any running state -> CRASHED when the process exits unasked.

It watches the processes (exits, heartbeats, start and stop deadlines) and reports what the
supervisor must act on through callbacks: a spawn, a worker gone silent, an exit (stopped
or crashed). What happens to the worker's requests is the supervisor's business.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from engine.server.worker_handle import WorkerHandle, WorkerState

HEARTBEAT_TIMEOUT_S = 30.0  # only for hung workers: a dead one is seen at once by its exit
UNRESPONSIVE_S = 10.0  # the supervisor is told before the heartbeat timeout kills it
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 5.0
ROLES = ("prefill", "decode")


class WorkerPool:
    def __init__(self, counts: dict[str, int], run_dir: Path, bus_endpoint: str, *,
                 config: Callable[[], dict], send: Callable[[WorkerHandle, dict], None],
                 on_spawn: Callable[[WorkerHandle], None], on_silent: Callable[[WorkerHandle, float], None],
                 on_stop: Callable[[WorkerHandle], None], on_exit: Callable[[WorkerHandle, bool], None]):
        """counts: workers per role. config(): the config dict a (re)started worker gets.
        send(worker, header): a bus message. on_stop(worker): it is STOPPING (asked by a client,
        or drained for a restart), before it is told. on_exit(worker, crashed): after the state
        change; worker.reason says why."""
        self.bus_endpoint = bus_endpoint
        self._config, self._send = config, send
        self._on_spawn, self._on_silent, self._on_stop, self._on_exit = on_spawn, on_silent, on_stop, on_exit
        self._restart_after_stop: set[str] = set()
        self._stop_deadline: dict[str, float] = {}
        self.handles: dict[str, WorkerHandle] = {}
        for role in ROLES:
            for i in range(counts.get(role, 0)):
                self.handles[f"{role}-{i}"] = WorkerHandle(f"{role}-{i}", role, run_dir)

    # ---- lookups ----------------------------------------------------------------------
    def __getitem__(self, name: str) -> WorkerHandle:
        return self.handles[name]

    def __iter__(self):
        return iter(self.handles)

    def __contains__(self, name) -> bool:
        return name in self.handles

    def get(self, name) -> WorkerHandle | None:
        return self.handles.get(name)

    def values(self):
        return self.handles.values()

    def role(self, role: str) -> list[WorkerHandle]:
        return [w for w in self.handles.values() if w.role == role]

    @staticmethod
    def alive(worker: WorkerHandle) -> bool:
        """Its process runs (a message sent to it can arrive)."""
        return worker.proc is not None and worker.poll_exit() is None

    # ---- the edges ----------------------------------------------------------------------
    def start_all(self) -> None:
        for worker in self.handles.values():
            self.spawn(worker)

    def spawn(self, worker: WorkerHandle) -> None:
        """-> STARTING. Raises RuntimeError when its process still runs."""
        worker.spawn(self._config(), self.bus_endpoint)
        self._on_spawn(worker)

    def hello(self, worker: WorkerHandle, info: dict) -> None:
        """STARTING -> READY (the caller checked the token)."""
        if worker.state != WorkerState.STARTING:
            raise ValueError(f"worker {worker.name} said hello while {worker.state.value}")
        worker.info = info
        worker.stats = {"free_pages": info["pool"]["pages"], "used_pages": 0}
        worker.state, worker.last_seen = WorkerState.READY, time.monotonic()

    def drain(self, worker: WorkerHandle) -> None:
        """READY -> DRAINING: no new requests; it restarts when its last one ends. Other states:
        a stopped or crashed worker picks up a new config at its next start anyway."""
        if worker.state == WorkerState.READY:
            worker.state = WorkerState.DRAINING

    def stop(self, worker: WorkerHandle, *, restart: bool = False) -> bool:
        """-> STOPPING (asked to shut down; killed past STOP_TIMEOUT_S) or, when its process is
        gone already, STOPPED (and respawned when `restart`). True when a stop is under way."""
        if not self.alive(worker):
            worker.state = WorkerState.STOPPED
            if restart:
                self.spawn(worker)
            return False
        worker.state = WorkerState.STOPPING
        self._stop_deadline[worker.name] = time.monotonic() + STOP_TIMEOUT_S
        if restart:
            self._restart_after_stop.add(worker.name)
        self._on_stop(worker)
        self._send(worker, {"op": "stop"})
        return True

    def watch(self, now: float | None = None) -> None:
        """One pass: exits, silence, hung workers, start and stop deadlines, drained workers."""
        now = time.monotonic() if now is None else now
        for worker in self.handles.values():
            code = worker.poll_exit()
            silent = now - worker.last_seen
            if code is not None and worker.state not in (WorkerState.STOPPED, WorkerState.CRASHED):
                self._exited(worker, code)
            elif worker.state == WorkerState.READY and UNRESPONSIVE_S < silent <= HEARTBEAT_TIMEOUT_S:
                self._on_silent(worker, silent)
            elif worker.state == WorkerState.READY and silent > HEARTBEAT_TIMEOUT_S:
                worker.reason = f"no heartbeat for {silent:.1f} s"
                worker.dump_stack()
                worker.kill()  # hung: the exit is handled on the next pass
            elif worker.state == WorkerState.STARTING and now - worker.started_at > START_TIMEOUT_S:
                worker.reason = f"did not say hello within {START_TIMEOUT_S:.0f} s"
                worker.kill()
            elif worker.state == WorkerState.STOPPING and now > self._stop_deadline.get(worker.name, now + 1):
                worker.kill()
            elif worker.state == WorkerState.DRAINING and not worker.inflight:
                self.stop(worker, restart=True)

    def shutdown(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Ask every running worker to shut down; kill what has not exited after timeout_s."""
        for worker in self.handles.values():
            if self.alive(worker):
                self._send(worker, {"op": "stop"})
        deadline = time.monotonic() + timeout_s
        for worker in self.handles.values():
            while self.alive(worker) and time.monotonic() < deadline:
                time.sleep(0.02)
            worker.kill()

    def _exited(self, worker: WorkerHandle, code: int) -> None:
        worker.exit_code = code
        if worker.state == WorkerState.STOPPING:
            worker.state = WorkerState.STOPPED
            self._on_exit(worker, False)
            if worker.name in self._restart_after_stop:
                self._restart_after_stop.discard(worker.name)
                self.spawn(worker)
            return
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        worker.reason = f"{worker.reason}; {how}" if worker.reason else how
        worker.state = WorkerState.CRASHED
        self._on_exit(worker, True)
