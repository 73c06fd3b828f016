"""LocalServer: `python main.py serve` in a subprocess on loopback with free ports, driven
through the real EngineClient — for `reproduce`, the benches and the end-to-end tests.
`serve_command` is the command line it (and the GUI's hosted engine) starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from engine.client import EngineClient, TelemetrySubscriber
from engine.config import REPO_ROOT, EngineConfig
from engine.parent_watch import PARENT_ENV

READY_TIMEOUT_S = 180.0
MAIN = REPO_ROOT / "main.py"


def serve_command(*args: str, bind: str = "tcp://127.0.0.1:0") -> list[str]:
    """`python main.py serve --bind BIND --json ARGS...`: one JSON line with the endpoints on
    stdout once it listens. Run it with cwd=REPO_ROOT."""
    return [sys.executable, str(MAIN), "serve", "--bind", bind, "--json", *args]


def write_config(path: Path, base: EngineConfig | None = None, **sections) -> Path:
    """A TOML config: `base` (default: CPU, torch kernels, canaries off — they would add
    requests at a time no test controls) with `sections` merged in (engine={...}, ...)."""
    if base is None:
        base = EngineConfig().replace(model={"device": "cpu"}, engine={"kernels": "torch"},
                                      canaries={"enabled": False})
    config = base.replace(**sections)
    lines = []
    for name, values in config.to_dict().items():
        if name == "pools":
            for pool, pool_values in values.items():
                lines.append(f"[pools.{pool}]")
                lines += [f"{k} = {json.dumps(v)}" for k, v in pool_values.items()]
            continue
        lines.append(f"[{name}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


class LocalServer:
    def __init__(self, config_path: Path, *extra: str, bind: str = "tcp://127.0.0.1:0", wrap=None):
        """wrap(command) -> command: run serve inside something (a private mount namespace whose
        disk the test fills, say); the wrapper must exec serve so that kill() reaches it."""
        self.log_path = config_path.with_suffix(".log")
        command = serve_command("--config", str(config_path), *extra, bind=bind)
        with open(self.log_path, "wb") as log:  # a file, so a chatty server never blocks on a pipe
            self.proc = subprocess.Popen(
                wrap(command) if wrap else command,
                cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=log, text=True,
                env={**os.environ, PARENT_ENV: str(os.getpid())},  # it dies with this process
            )
        line = self.proc.stdout.readline()
        ready = json.loads(line) if line.strip() else {}
        if not ready.get("ready"):  # no line, or serve's JSON error line
            self.proc.wait()
            self.proc.stdout.close()
            why = ready.get("error", {}).get("message") if isinstance(ready.get("error"), dict) else None
            raise RuntimeError(f"serve did not start: {why or self.log_path.read_text()}")
        self.ready = ready
        self.control, self.telemetry = self.ready["control"], self.ready["telemetry"]
        self._clients: list[EngineClient] = []

    def subscriber(self, topics=("",), *, wait: bool = True, wait_s: float = 60.0, **kwargs) -> TelemetrySubscriber:
        """A subscriber whose subscriptions the supervisor has taken (status says so), so no
        message published from now on is missed; TimeoutError after wait_s. (The XPUB reports
        a topic once: when another subscriber holds it already, this cannot wait for ours.)"""
        sub = TelemetrySubscriber(self.telemetry, topics, **kwargs)
        self._clients.append(sub)
        if not wait:  # (a subscriber the server is expected to refuse)
            return sub
        client = EngineClient(self.control, timeout_s=wait_s, server_key=kwargs.get("server_key"),
                              client_keys=kwargs.get("client_keys"))
        try:
            deadline = time.monotonic() + wait_s
            while not set(topics) <= set(client.status()["telemetry"]["subscriptions"]):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the supervisor did not take the subscriptions {list(topics)} "
                                       f"within {wait_s} s")
                time.sleep(0.02)
        finally:
            client.close()
        return sub

    def client(self, **kwargs) -> EngineClient:
        client = EngineClient(self.control, timeout_s=kwargs.pop("timeout_s", 120.0), **kwargs)
        self._clients.append(client)
        return client

    def wait_workers(self, client: EngineClient, state: str = "ready", names=None,
                     timeout_s: float = READY_TIMEOUT_S) -> dict:
        """Poll status until the named workers (default: all) are in `state`."""
        deadline = time.monotonic() + timeout_s
        while True:
            status = client.status()
            workers = {w["name"]: w for w in status["workers"]}
            wanted = names or list(workers)
            if all(workers[n]["state"] == state for n in wanted):
                return status
            if time.monotonic() > deadline:
                raise TimeoutError(f"workers not {state} after {timeout_s} s: "
                                   f"{[(n, w['state'], w['reason']) for n, w in workers.items()]}")
            time.sleep(0.2)

    def kill(self) -> None:
        """SIGKILL the supervisor (its workers follow it: they die with their parent)."""
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        for client in self._clients:
            client.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()

    def check_alive(self) -> None:
        """Raise RuntimeError with the end of the server's log when it has exited."""
        code = self.proc.poll()
        if code is not None:
            tail = self.log()[-3000:]
            raise RuntimeError(f"the engine exited (status {code}); the end of its log {self.log_path}:\n{tail}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")
