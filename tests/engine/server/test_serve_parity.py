"""The disaggregated engine (real supervisor, prefill and decode processes, KV over
ZeroMQ) gives the same greedy tokens as the single-process engine."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.config import EngineConfig
from engine.core import Engine
from engine.request import SamplingParams

pytestmark = pytest.mark.e2e  # real engine processes


def _workload(seed: int, n: int = 64):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 200, (n,), generator=gen).tolist()
    prompts = [[256, *torch.randint(0, 256, (k,), generator=gen).tolist()] for k in lengths]
    news = torch.randint(1, 12, (n,), generator=gen).tolist()
    return prompts, news


def test_64_concurrent_requests_match_the_single_process_engine(start_server, tiny_model):
    seed = int(np.random.SeedSequence().entropy % 2**31)
    prompts, news = _workload(seed)
    server = start_server(workers={"prefill": 1, "decode": 2}, engine={"max_batch": 16})
    client = server.client()
    streams = [client.submit(p, max_new_tokens=n, ignore_eos=True, stream=False) for p, n in zip(prompts, news)]
    done = {}
    for stream in streams:
        for msg in client.events(stream):
            if msg.op in ("done", "error"):
                done[stream] = msg.header

    local = Engine(EngineConfig().replace(model={"device": "cpu"}, engine={"kernels": "torch", "max_batch": 64}),
                   tiny_model)
    expected = [
        local.submit(p, SamplingParams(max_new_tokens=n, ignore_eos=True)) for p, n in zip(prompts, news)]
    local.run_until_idle()
    for i, (stream, want) in enumerate(zip(streams, expected)):
        got = done[stream]
        assert got["op"] == "done" and got.get("error") is None, (seed, got)
        assert got["token_ids"] == want.output_ids, f"seed {seed}: request {i} ({len(prompts[i])} tokens)"
    status = client.status()
    assert status["counters"]["transfers_ok"] == 64 and status["counters"]["finished"] == 64
    assert {done[s]["decode_worker"] for s in streams} == {"decode-0", "decode-1"}
    assert all(w["state"] == "ready" for w in status["workers"])
