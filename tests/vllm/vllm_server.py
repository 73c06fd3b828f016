"""VllmServer: a real vLLM (the CPU build, from its own venv) started on loopback for a test or a bench.

The venv is `make vllm-venv`'s `.venv-vllm` unless PAGEWARDEN_VLLM_PYTHON names another
interpreter. Setup facts (../shared/MACHINE-NOTES.md): `python -m
vllm.entrypoints.openai.api_server` (the console script fails), --block-size a multiple of 32
on CPU, VLLM_CPU_KVCACHE_SPACE and --num-gpu-blocks-override keep the pool small, the KV-event
publisher binds only for ipc:// (or a wildcard) endpoints.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = REPO / "resources" / "models" / "pagewarden-copy"
START_TIMEOUT_S = 420.0  # vLLM compiles its model at start: minutes on a loaded 2-core machine
VLLM_VERSION = "0.32.0"


def vllm_python() -> Path:
    return Path(os.environ.get("PAGEWARDEN_VLLM_PYTHON") or REPO / ".venv-vllm" / "bin" / "python")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VllmServer:
    """Start with `with VllmServer(...) as vllm:`; `vllm.url` is the OpenAI base URL."""

    def __init__(self, *, model: Path = DEFAULT_MODEL, num_blocks: int = 128, block_size: int = 32,
                 max_model_len: int = 512, kv_events: bool = False, agent: dict | None = None,
                 prefix_caching: bool = True, extra_args: tuple[str, ...] = (), env: dict | None = None,
                 log_path: Path | None = None, pin: tuple[int, int] | None = None):
        """pin=(worker core, other core): vLLM's model worker alone on the first core, its API
        server and engine core on the second (benches: less noise from where the OS puts them)."""
        self.dir = Path(tempfile.mkdtemp(prefix="pw-vllm-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.kv_pub = f"ipc://{self.dir}/kv-events" if kv_events else None
        self.kv_replay = f"ipc://{self.dir}/kv-replay" if kv_events else None
        self.agent_control = None
        self.agent_metrics = (agent or {}).get("metrics")  # HOST:PORT of the agent's /metrics, if asked
        args = [str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                "--host", "127.0.0.1", "--port", str(self.port), "--dtype", "float32",
                "--block-size", str(block_size), "--num-gpu-blocks-override", str(num_blocks),
                "--max-model-len", str(max_model_len), "--served-model-name", "pagewarden-copy",
                "--seed", "0"]
        args.append("--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching")
        if kv_events:
            args += ["--kv-events-config", json.dumps({
                "enable_kv_cache_events": True, "publisher": "zmq", "endpoint": self.kv_pub,
                "replay_endpoint": self.kv_replay, "topic": "kv-events"})]
        if agent is not None:
            self.agent_control = agent.get("control") or f"tcp://127.0.0.1:{free_port()}"
            extra = {"control": self.agent_control, "telemetry": f"tcp://127.0.0.1:{free_port()}",
                     **{k: v for k, v in agent.items() if k != "control"}}
            args += ["--kv-transfer-config", json.dumps({
                "kv_connector": "PageWardenConnector", "kv_role": "kv_producer",
                "kv_connector_module_path": "engine.vllm_agent.connector",
                "kv_connector_extra_config": extra})]
        self.args = [*args, *extra_args]
        pinned = {}
        if pin is not None:
            self.args = ["taskset", "-c", str(pin[1]), *self.args]
            pinned = {"VLLM_CPU_OMP_THREADS_BIND": str(pin[0])}
        self.env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "INFO",
                    "PYTHONPATH": str(REPO), "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
                    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **pinned, **(env or {})}
        self.log_path = log_path or self.dir / "vllm.log"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "VllmServer":
        if not vllm_python().exists():
            raise FileNotFoundError(f"no vLLM interpreter at {vllm_python()}: run `make vllm-venv` first "
                                    "(or set PAGEWARDEN_VLLM_PYTHON)")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT, env=self.env,
                                     start_new_session=True)
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode} while starting:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"vLLM did not answer /health within {timeout_s:g} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 150) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def complete(self, prompt: str, max_tokens: int = 16, **fields) -> dict:
        body = json.dumps({"model": "pagewarden-copy", "prompt": prompt, "max_tokens": max_tokens,
                           "temperature": 0, **fields}).encode()
        req = urllib.request.Request(f"{self.url}/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            return json.loads(resp.read())

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
            except ProcessLookupError:
                pass
        if getattr(self, "_log", None):
            self._log.close()

    def __exit__(self, *exc) -> None:
        self.stop()


if __name__ == "__main__":  # a quick look: start one, complete once, print, stop
    with VllmServer(agent={} if "--agent" in sys.argv else None, kv_events="--kv-events" in sys.argv) as v:
        print(v.complete("hello world", 8))
        print("log:", v.log_path)
