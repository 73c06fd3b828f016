"""The --kv-transfer-config of a vLLM prefill/decode pair, with or without PageWarden's
verifying connector around vLLM's ExampleConnector (KV through files on a shared path), and
the digest module built before any vLLM starts. Shared by tests/vllm/test_vllm_verify.py and
bench/vllm_verify_cost.py."""

from __future__ import annotations

import json
import os
import subprocess

from tests.vllm.vllm_server import REPO, vllm_python


def digest_backend() -> tuple[str, dict]:
    """Build the CPU digest module with vLLM's interpreter before any server starts (a build
    inside vLLM's start would count against its start timeout). Where it cannot be built the
    servers run the torch reference: (which ran, the env that makes vLLM run it)."""
    try:
        done = subprocess.run([str(vllm_python()), "-c", "from kernels.block_digest import digest_backend; "
                               "print(digest_backend('cpu'))"], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                              capture_output=True, text=True, timeout=900)
        backend = (done.stdout.strip().splitlines() or ["torch"])[-1]
    except subprocess.TimeoutExpired:
        backend = "torch"
    return backend, ({} if backend == "C++" else {"PAGEWARDEN_CPU_KERNELS": "reference"})


def transfer_config(role: str, store: str, *, verified: bool = True, **extra) -> tuple[str, str]:
    """vLLM's argument pair for one instance of the pair: ExampleConnector alone, or wrapped
    (`extra`: the verifying connector's own keys: verify, agent, test_fault, ...)."""
    inner = {"kv_connector": "ExampleConnector", "kv_connector_extra_config": {"shared_storage_path": store}}
    if not verified:
        return ("--kv-transfer-config", json.dumps({**inner, "kv_role": role, "kv_load_failure_policy": "recompute"}))
    return ("--kv-transfer-config", json.dumps({
        "kv_connector": "PageWardenVerifyingConnector", "kv_connector_module_path": "engine.vllm_agent.verify.connector",
        "kv_role": role, "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"inner": inner, **extra}}))
