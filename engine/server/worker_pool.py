"""WorkerPool: the worker processes, and the one place a worker's state changes.

    STOPPED/CRASHED -> STARTING (spawn) -> READY (a valid hello) -> DRAINING (reconfigure:
    no new requests; restarts when its last one ends) -> STOPPING (asked to shut down) ->
    STOPPED; any running state -> CRASHED when the process exits unasked; CRASHED ->
    STARTING again after a backoff, by the restart policy ([workers] restart, restart_limit,
    restart_backoff_ms), until it has crashed restart_limit times in a row.

It watches the processes (exits, heartbeats, start and stop deadlines) and reports what the
supervisor must act on through callbacks: a spawn, a worker gone silent, an exit (stopped
or crashed). What happens to the worker's requests is the supervisor's business.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, ValuesView
from pathlib import Path
from typing import Any

from engine.config import WORKER_ROLES, core_slot
from engine.server.worker_handle import WorkerHandle
from engine.wire.messages import to_worker
from engine.wire.messages.base import WorkerCommand
from engine.wire.protocol import HEARTBEAT_TIMEOUT_S
from engine.wire.states import WorkerState

UNRESPONSIVE_S = 10.0  # silent this long: the supervisor is told (a pending alert) ...
UNRESPONSIVE_FIRING_S = 20.0  # ... and this long, it fires; the heartbeat timeout kills it later
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 5.0
STABLE_S = 60.0  # ready this long: its next crash is the first in a row again
MAX_BACKOFF_MS = 60_000


class WorkerPool:
    def __init__(self, counts: dict[str, int], run_dir: Path, bus_endpoint: str, *,
                 config: Callable[[], dict[str, Any]], send: Callable[[WorkerHandle, WorkerCommand], None],
                 on_spawn: Callable[[WorkerHandle], None], on_silent: Callable[[WorkerHandle, float], None],
                 on_stop: Callable[[WorkerHandle], None], on_exit: Callable[[WorkerHandle, bool], None]) -> None:
        """counts: workers per role. config(): the config dict a (re)started worker gets.
        send(worker, command): a bus message. on_stop(worker): it is STOPPING (asked by a client,
        or drained for a restart), before it is told. on_exit(worker, crashed): after the state
        change; worker.reason says why."""
        self.bus_endpoint = bus_endpoint
        self._config, self._send = config, send
        self._on_spawn, self._on_silent, self._on_stop, self._on_exit = on_spawn, on_silent, on_stop, on_exit
        self._restart_after_stop: set[str] = set()
        self._stop_deadline: dict[str, float] = {}
        self.handles: dict[str, WorkerHandle] = {}
        for role in WORKER_ROLES:
            for i in range(counts.get(role, 0)):
                self.handles[f"{role}-{i}"] = WorkerHandle(f"{role}-{i}", role, run_dir, core_slot=core_slot(role, i))

    # ---- lookups ----------------------------------------------------------------------
    def __getitem__(self, name: str) -> WorkerHandle:
        return self.handles[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.handles)

    def __contains__(self, name: object) -> bool:
        return name in self.handles

    def get(self, name: str | None) -> WorkerHandle | None:
        """None too for no name: a request not placed on a worker of that role."""
        return self.handles.get(name) if name is not None else None

    def values(self) -> ValuesView[WorkerHandle]:
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

    def spawn(self, worker: WorkerHandle, reason: str = "start") -> None:
        """-> STARTING. reason: "start" (a first start, or asked for: the crash count starts
        afresh) or "restart" (the policy, after a crash). Raises RuntimeError when its
        process still runs."""
        worker.spawn(self._config(), self.bus_endpoint)
        worker.spawn_reason = reason
        if reason == "start":
            worker.crashes_in_a_row = 0
        self._on_spawn(worker)

    def can_return(self, role: str) -> bool:
        """Some worker of `role` is up, on its way up, due to be restarted, or stopped (an
        operator may start it): not every one of them crashed for good."""
        return any(not (w.state == WorkerState.CRASHED and w.restart_at is None) for w in self.role(role))

    def why_none_ready(self, role: str) -> str | None:
        """None when a worker of `role` takes requests; else what each of them is doing."""
        workers = self.role(role)
        if any(w.accepting for w in workers):
            return None
        states = [f"{w.name} {w.state.value}" + (f" ({w.reason})" if w.reason else "") for w in workers]
        return f"no {role} worker is ready: " + ("; ".join(states) or "none configured")

    def hello(self, worker: WorkerHandle, info: dict[str, Any]) -> None:
        """STARTING -> READY (the caller checked the token)."""
        if worker.state != WorkerState.STARTING:
            raise ValueError(f"worker {worker.name} said hello while {worker.state.value}")
        worker.ready_with(info)
        worker.state, worker.last_seen = WorkerState.READY, time.monotonic()
        worker.ready_at = worker.last_seen

    def drain(self, worker: WorkerHandle) -> None:
        """READY -> DRAINING: no new requests; it restarts when its last one ends. Other states:
        a stopped or crashed worker picks up a new config at its next start anyway."""
        if worker.state == WorkerState.READY:
            worker.state = WorkerState.DRAINING

    def stop(self, worker: WorkerHandle, *, restart: bool = False) -> bool:
        """-> STOPPING (asked to shut down; killed past STOP_TIMEOUT_S) or, when its process is
        gone already, STOPPED (and respawned when `restart`). True when a stop is under way."""
        if not self.alive(worker):
            worker.state, worker.restart_at = WorkerState.STOPPED, None  # asked: no automatic restart
            if restart:
                self.spawn(worker)
            return False
        worker.state = WorkerState.STOPPING
        self._stop_deadline[worker.name] = time.monotonic() + STOP_TIMEOUT_S
        if restart:
            self._restart_after_stop.add(worker.name)
        self._on_stop(worker)
        self._send(worker, to_worker.Stop())
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
            elif worker.state == WorkerState.CRASHED and worker.restart_at is not None and now >= worker.restart_at:
                self.spawn(worker, reason="restart")

    def shutdown(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Ask every running worker to shut down; kill what has not exited after timeout_s."""
        for worker in self.handles.values():
            if self.alive(worker):
                self._send(worker, to_worker.Stop())
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
        self._schedule_restart(worker)
        self._on_exit(worker, True)

    def _schedule_restart(self, worker: WorkerHandle) -> None:
        """The restart policy, for a worker that just crashed: when (if ever) it starts again."""
        now = time.monotonic()
        if worker.ready_at and now - worker.ready_at >= STABLE_S:
            worker.crashes_in_a_row = 0
        worker.crashes_in_a_row += 1
        policy = self._config().get("workers", {})
        limit = int(policy.get("restart_limit", 5))
        if policy.get("restart", "on-failure") != "on-failure":
            worker.reason += "; not restarted (workers.restart = never)"
        elif worker.crashes_in_a_row > limit:
            worker.reason += (f"; not restarted: {worker.crashes_in_a_row} crashes in a row "
                              f"(workers.restart_limit = {limit})")
        else:
            backoff_ms = min(int(policy.get("restart_backoff_ms", 1000)) * 2 ** (worker.crashes_in_a_row - 1),
                             MAX_BACKOFF_MS)
            worker.restart_at = now + backoff_ms / 1000
            worker.reason += (f"; restarting in {backoff_ms / 1000:.1f} s (crash {worker.crashes_in_a_row} "
                              f"in a row of at most {limit})")
