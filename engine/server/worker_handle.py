"""WorkerHandle: the supervisor's view of one worker process and its lifecycle."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.config import REPO_ROOT
from engine.wire.protocol import TOKEN_ENV
from engine.wire.states import WorkerState


@dataclass
class WorkerHandle:
    name: str
    role: str  # "prefill" | "decode"
    run_dir: Path
    state: WorkerState = WorkerState.STOPPED
    proc: subprocess.Popen[bytes] | None = None
    token: str = ""
    info: dict[str, Any] = field(default_factory=dict)  # from its hello
    stats: dict[str, Any] = field(default_factory=dict)  # from its last heartbeat
    inflight: set[str] = field(default_factory=set)  # requests it holds now: written by Placement only
    last_seen: float = 0.0
    started_at: float = 0.0
    restarts: int = 0
    exit_code: int | None = None
    reason: str = ""  # why it last stopped or crashed
    ready_at: float = 0.0  # when it last said hello (0: not since its last spawn)
    crashes_in_a_row: int = 0  # without a minute of being ready in between
    restart_at: float | None = None  # a crashed worker's scheduled restart (monotonic)
    spawn_reason: str = ""  # "start" (first, or asked by a client) or "restart" (after a crash)
    core_slot: int = 0  # its slot in the run directory's core-share file (engine/workers/core_share.py)

    @property
    def identity(self) -> bytes:
        return self.name.encode()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def log_path(self) -> Path:
        return self.run_dir / f"{self.name}.log"

    @property
    def accepting(self) -> bool:
        return self.state == WorkerState.READY

    # ---- free pages: the supervisor's estimate, written only by the four methods below ----
    @property
    def free_pages(self) -> int:
        return int(self.stats.get("free_pages", self.info.get("pool", {}).get("pages", 0)))

    def ready_with(self, info: dict[str, Any]) -> None:
        """Its hello: what it is, and an empty pool."""
        self.info = info
        self.stats = {"free_pages": info["pool"]["pages"], "used_pages": 0}

    def heartbeat(self, stats: dict[str, Any]) -> None:
        """Its periodic report: every stat, its free pages among them."""
        self.stats = stats

    def report_free_pages(self, pages: int) -> None:
        """The free pages it counted in an answer (reserved, released, tokens...)."""
        self.stats["free_pages"] = pages

    def promise_pages(self, pages: int) -> None:
        """A reservation sent and not answered yet: counted as taken until its next report,
        so that one loop turn does not promise the same pages twice."""
        self.stats["free_pages"] = self.free_pages - pages

    def spawn(self, config_dict: dict[str, Any], bus_endpoint: str) -> None:
        """Start the worker process; it says hello on the bus when its model is loaded."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"worker {self.name} is already running (pid {self.proc.pid})")
        if self.proc is not None:
            self.restarts += 1
        self.token = secrets.token_hex(16)
        env = {**os.environ, TOKEN_ENV: self.token}
        log = open(self.log_path, "ab")
        cmd = [
            sys.executable, "-m", "engine.workers.main", "--role", self.role, "--name", self.name,
            "--bus", bus_endpoint, "--run-dir", str(self.run_dir), "--core-slot", str(self.core_slot),
            "--config-json", json.dumps(config_dict),
        ]
        self.proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        log.close()
        self.state, self.info, self.stats = WorkerState.STARTING, {}, {}
        self.started_at = self.last_seen = time.monotonic()
        self.exit_code, self.reason, self.ready_at, self.restart_at = None, "", 0.0, None

    def poll_exit(self) -> int | None:
        """The exit code if the process has ended, else None."""
        if self.proc is None:
            return None
        return self.proc.poll()

    def dump_stack(self) -> None:
        """Ask a hung worker to write its Python stack into its log (SIGUSR1, faulthandler)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGUSR1)
            time.sleep(0.3)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def log_tail(self, lines: int = 8) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def describe(self) -> dict[str, Any]:
        pool = self.info.get("pool", {})
        return {
            "name": self.name, "role": self.role, "state": self.state.value, "pid": self.pid,
            "device": self.info.get("device"), "kernels": self.info.get("kernels"),
            "attention": self.info.get("attention"),  # e.g. "in place, C++ (AVX2)"
            "kernels_fallback": self.info.get("kernels_fallback") or "",  # why it runs the slow references
            "threads": self.info.get("threads"),  # the most it computes with
            "threads_shared": self.info.get("threads_shared", False),  # divided among the computing workers
            "pool": {
                "name": pool.get("name", self.name), "pages": pool.get("pages"),
                "page_size": pool.get("page_size"), "used_pages": self.stats.get("used_pages"),
                "free_pages": self.stats.get("free_pages"),
            },
            "inflight": len(self.inflight), "restarts": self.restarts, "exit_code": self.exit_code,
            "reason": self.reason, "stats": dict(self.stats), "crashes_in_a_row": self.crashes_in_a_row,
            "restart_in_s": (None if self.restart_at is None
                             else round(max(0.0, self.restart_at - time.monotonic()), 3)),
            "uptime_s": round(time.monotonic() - self.started_at, 3) if self.started_at else None,
        }
