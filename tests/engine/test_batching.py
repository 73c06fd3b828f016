"""Continuous batching, and paged output equal to the unpaged dense reference with pages
scattered randomly in a pool full of stale data."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.dense_reference import dense_greedy
from engine.request import Request, RequestState, SamplingParams
from engine.sampling import sample_next
from engine.wire.page_tags import PageState


def _params(n: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, ignore_eos=True)


def _scramble(pool, seed: int) -> None:
    """Fill the pool with stale data and leave its free list in random order."""
    rng = np.random.default_rng(seed)
    pages = pool.allocate(10**6, pool.num_pages).pages
    pool.data.copy_(torch.randn(pool.data.shape, generator=torch.Generator().manual_seed(seed)) * 50)
    for page in rng.permutation(pages):
        pool.free(10**6, [page])


def _capture_logits(engine) -> dict[str, list[torch.Tensor]]:
    """Record each request's logits as the engine computes them (observation only)."""
    seen: dict[str, list[torch.Tensor]] = {}
    prefill, decode = engine.runner.prefill, engine.runner.decode

    def record(requests, logits):
        for req, row in zip(requests, logits):
            seen.setdefault(req.request_id, []).append(row.clone())

    def prefill_and_record(requests):
        logits = prefill(requests)
        record(requests, logits)
        return logits

    def decode_and_record(requests):
        result = decode(requests)
        record(requests, result.logits)
        return result

    engine.runner.prefill, engine.runner.decode = prefill_and_record, decode_and_record
    return seen


def test_paged_equals_dense_reference_with_scattered_pages(make_engine):
    seed = int(np.random.SeedSequence().entropy % 2**32)
    engine = make_engine(decode_pages=64, scrub_policy="none", page_size=4)
    _scramble(engine.pool, seed)
    gen = torch.Generator().manual_seed(seed)
    prompts = [[256, *torch.randint(0, 256, (n,), generator=gen).tolist()] for n in (0, 3, 4, 9, 30, 57)]
    logits = _capture_logits(engine)
    requests = [engine.submit(p, _params(10)) for p in prompts]
    engine.step()
    tables = [r.page_table.pages for r in requests]
    assert any((np.diff(t) != 1).any() for t in tables if len(t) > 1), "pages were not scattered"
    engine.run_until_idle()
    for prompt, req in zip(prompts, requests):
        tokens, ref_logits = dense_greedy(engine.model.decoder, prompt, 10)
        assert req.output_ids == tokens, f"seed {seed}: prompt of {len(prompt)} tokens"
        got = torch.stack(logits[req.request_id])
        torch.testing.assert_close(got, torch.stack(ref_logits), rtol=1e-4, atol=1e-4)


def test_new_requests_join_the_running_batch(make_engine):
    engine = make_engine()
    a = engine.submit([256, 1, 2, 3], _params(12), request_id="a")
    for _ in range(3):
        engine.step()
    b = engine.submit([256, 9, 8, 7, 6, 5], _params(5), request_id="b")
    outputs = {o.request_id: o for o in engine.step()}
    # One step: a decodes its 4th token while b is prefilled and gets its first.
    assert set(outputs) == {"a", "b"}
    assert len(a.output_ids) == 4 and len(b.output_ids) == 1
    engine.run_until_idle()
    for req in (a, b):
        assert req.output_ids == dense_greedy(engine.model.decoder, req.prompt_ids, req.params.max_new_tokens)[0]


def test_finished_requests_free_their_pages_in_the_same_step(make_engine):
    engine = make_engine(page_size=16, prefix_cache="off")  # a cached prompt page would stay in use
    short = engine.submit([256] * 20, _params(2))  # 22 tokens: 2 pages
    long = engine.submit([256] * 20, _params(30))  # 50 tokens: 4 pages
    engine.step()
    assert engine.pool.used_pages == 6
    engine.step()  # short's second token: it finishes in this step
    assert short.state == RequestState.FINISHED and long.state == RequestState.RUNNING
    assert engine.pool.used_pages == 4
    assert (engine.pool.state[long.page_table.pages[:2]] == PageState.WRITTEN).all()
    assert engine.pool.state[long.page_table.pages[3]] == PageState.RESERVED


def test_max_batch_caps_the_running_set(make_engine):
    engine = make_engine(max_batch=2)
    reqs = [engine.submit([256, i], _params(3)) for i in range(5)]
    engine.step()
    assert [r.state for r in reqs].count(RequestState.RUNNING) == 2
    engine.run_until_idle()
    assert all(len(r.output_ids) == 3 for r in reqs)


def test_eos_stops_unless_ignored(make_engine):
    engine = make_engine()
    probe = engine.submit([256, 5], _params(6))
    engine.run_until_idle()
    first = probe.output_ids[0]
    engine._stop_ids = {first}  # make the model's first choice the end-of-sequence token
    stops = engine.submit([256, 5], SamplingParams(max_new_tokens=6))
    runs_on = engine.submit([256, 5], _params(6))
    engine.run_until_idle()
    assert stops.output_ids == [first] and stops.finish_reason == "eos"
    assert len(runs_on.output_ids) == 6 and runs_on.finish_reason == "length"


def test_seeded_sampling_is_reproducible(make_engine):
    params = SamplingParams(max_new_tokens=8, temperature=1.0, top_k=50, top_p=0.9, seed=11, ignore_eos=True)
    outs = []
    for _ in range(2):
        engine = make_engine()
        req = engine.submit([256, 1, 2], params)
        engine.run_until_idle()
        outs.append(req.output_ids)
    assert outs[0] == outs[1] and len(outs[0]) == 8


def test_triton_kernels_drive_the_engine_to_the_same_tokens(make_engine):
    """The production GPU path (Triton, here under the interpreter) inside the real engine:
    strided q from the fused projection, per-layer stamping, per-layer tag checks."""
    prompts = [[256, 1, 2, 3, 4, 5], [256, *range(40, 60)]]
    runs = {}
    for kernels in ("torch", "triton"):
        engine = make_engine(kernels=kernels, page_size=8)
        assert engine.kernels.name == kernels
        requests = engine.generate(prompts, _params(4))
        runs[kernels] = [r.output_ids for r in requests]
    assert runs["triton"] == runs["torch"]


@pytest.mark.parametrize("temperature", [1e-40, 5e-324, 9.99e-6])
def test_a_tiny_temperature_is_greedy_not_a_crash(make_engine, temperature):
    """logits / 1e-40 overflowed float32: softmax NaN, torch.multinomial raised, and in a
    prefill worker that ended the process (issue 14). Below GREEDY_BELOW it is greedy."""
    prompt = [256, *range(70, 90)]
    engine = make_engine()
    tiny = engine.submit(prompt, SamplingParams(max_new_tokens=6, temperature=temperature, seed=3, ignore_eos=True))
    greedy = engine.submit(list(prompt), SamplingParams(max_new_tokens=6, ignore_eos=True))
    engine.run_until_idle()
    assert tiny.finish_reason == "length" and tiny.output_ids == greedy.output_ids


def test_sampling_just_above_the_greedy_line_still_samples():
    from engine.request import GREEDY_BELOW

    assert SamplingParams(temperature=GREEDY_BELOW).greedy is False
    assert SamplingParams(temperature=GREEDY_BELOW / 2).greedy and SamplingParams().greedy
    logits = torch.tensor([[0.0, 1e-6, -5.0]])  # two logits closer than the line: a coin toss at t=1e-5
    req = Request("r", [1], SamplingParams(temperature=GREEDY_BELOW))  # a fresh random seed per draw
    picks = {sample_next(logits, [req], {})[0] for _ in range(40)}
    assert picks == {0, 1}
