"""Greedy output with the prefix cache on is HF transformers' own, token for token: across
tenants, shared and unshared prefixes, cache hits and evictions."""

from __future__ import annotations

import torch

from engine.config import EngineConfig
from engine.core import Engine
from engine.request import SamplingParams
from tests.hf_checkpoints import hf_greedy

NEW_TOKENS = 10
PAGE = 8


def _config(model_dir, scope: str, decode_pages: int) -> EngineConfig:
    return EngineConfig().replace(model={"path": str(model_dir), "dtype": "float32", "device": "cpu"},
                                  engine={"max_batch": 6, "page_size": PAGE},
                                  pools={"decode": {"pages": decode_pages}},
                                  prefix_cache={"scope": scope})


def _workload(seed: int) -> list[tuple[list[int], str]]:
    """Three system prompts (one exactly 4 pages long, two ragged), each followed by users'
    parts of assorted lengths, for two tenants; plus one prompt that is a whole system prompt."""
    gen = torch.Generator().manual_seed(seed)
    systems = [torch.randint(0, 300, (n,), generator=gen).tolist() for n in (32, 45, 61)]
    work = []
    for i in range(18):
        system = systems[i % 3]
        user = torch.randint(0, 300, (int(torch.randint(1, 20, (1,), generator=gen)),), generator=gen).tolist()
        work.append((system + user, ("acme", "globex")[i % 2]))
    work.append((systems[0], "acme"))  # all of it cached: its last token is still computed
    return work


def _run(model_dir, scope: str, work, decode_pages: int) -> tuple[Engine, list]:
    engine = Engine(_config(model_dir, scope, decode_pages))
    params = SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True)
    done = []
    for wave in (work[:6], work[6:12], work[12:]):  # later waves find what earlier ones cached
        done += [engine.submit(prompt, params, tenant=tenant) for prompt, tenant in wave]
        engine.run_until_idle()
    return engine, done


def test_greedy_tokens_equal_hf_and_the_uncached_engine_with_hits_and_evictions(checkpoint_dirs):
    model_dir = checkpoint_dirs["llama-gqa"]
    work = _workload(seed=7)
    # 48 pages: fewer than a wave needs of its own, so idle cached pages are evicted to admit the next
    cached, with_cache = _run(model_dir, "tenant", work, decode_pages=48)
    _, without = _run(model_dir, "off", work, decode_pages=48)
    want = hf_greedy(model_dir, [prompt for prompt, _ in work], NEW_TOKENS)
    counts = cached.cache.counts
    assert counts.hit_pages >= 12 and counts.evicted > 0, counts  # the test exercised both
    assert sum(r.cached_tokens > 0 for r in with_cache) >= 10
    assert cached.counters.ownership_violations == 0 and cached.counters.cross_reads == 0
    for i, (request, plain, expected) in enumerate(zip(with_cache, without, want)):
        assert request.output_ids == expected, f"request {i} ({request.cached_tokens} cached tokens) diverged from HF"
        assert plain.output_ids == expected


def test_tenants_never_share_under_tenant_scope_and_do_under_global(checkpoint_dirs):
    model_dir = checkpoint_dirs["llama-gqa"]
    system = list(range(3, 3 + 4 * PAGE))
    params = SamplingParams(max_new_tokens=2, ignore_eos=True)
    for scope, shared in (("tenant", False), ("global", True)):
        engine = Engine(_config(model_dir, scope, decode_pages=48))
        engine.submit(system + [7], params, tenant="acme")
        engine.run_until_idle()
        other = engine.submit(system + [8], params, tenant="globex")
        salted = engine.submit(system + [9], params, tenant="acme", cache_salt="s1")
        engine.run_until_idle()
        assert (other.cached_tokens > 0) == shared, scope
        assert salted.cached_tokens == 0  # a salt of its own shares with nobody who lacks it
        assert engine.counters.ownership_violations == 0
