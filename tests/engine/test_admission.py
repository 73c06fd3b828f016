"""I2: a request that cannot fit is rejected before any allocation, naming both numbers;
one that fits the window but not the free pages waits and is never truncated."""

from __future__ import annotations

import pytest

from engine.errors import AdmissionRejected, InvalidRequest
from engine.request import RequestState, SamplingParams


def _params(n: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, ignore_eos=True)


def _assert_nothing_allocated(engine, rejected_id: str | None = None) -> None:
    assert engine.pool.used_pages == 0
    assert not engine.scheduler.waiting and not engine.scheduler.running
    if rejected_id:
        assert rejected_id not in engine.requests


@pytest.mark.parametrize("total, admitted", [(63, True), (64, True), (65, False)])
def test_context_window_boundary(make_engine, total, admitted):
    engine = make_engine(context_window=64)
    prompt = [256] + [65] * (total - 5 - 1)
    if not admitted:
        with pytest.raises(AdmissionRejected) as err:
            engine.submit(prompt, _params(5), request_id="big")
        msg = str(err.value)
        assert "request big rejected before allocation" in msg
        assert f"it needs {total} tokens (prompt {total - 5} + max_new_tokens 5)" in msg
        assert "the context window is 64 tokens" in msg
        assert (err.value.needed_tokens, err.value.limit_tokens) == (total, 64)
        _assert_nothing_allocated(engine, "big")
        assert engine.counters.rejected == 1
        return
    request = engine.submit(prompt, _params(5))
    engine.run_until_idle()
    assert request.state == RequestState.FINISHED and len(request.output_ids) == 5


@pytest.mark.parametrize("total, admitted", [(63, True), (64, True), (65, False)])
def test_decode_pool_boundary(make_engine, total, admitted):
    engine = make_engine(context_window=1024, decode_pages=4)  # 4 x 16 = 64 tokens
    prompt = [256] * (total - 8)
    if admitted:
        request = engine.submit(prompt, _params(8))
        engine.run_until_idle()
        assert len(request.output_ids) == 8
        return
    with pytest.raises(AdmissionRejected, match=f"the decode pool must hold {total} of its {total} tokens .* but holds 64 tokens"):
        engine.submit(prompt, _params(8), request_id="r")
    _assert_nothing_allocated(engine, "r")


@pytest.mark.parametrize("prompt_len, admitted", [(31, True), (32, True), (33, False)])
def test_prefill_pool_boundary(make_engine, prompt_len, admitted):
    engine = make_engine(context_window=1024, prefill_pages=2)  # the prompt must fit 32 tokens
    if admitted:
        engine.submit([256] * prompt_len, _params(50))
        return
    with pytest.raises(AdmissionRejected, match="the prefill pool must hold 33 of its 83 tokens .* holds 32 tokens"):
        engine.submit([256] * prompt_len, _params(50))
    _assert_nothing_allocated(engine)


def test_request_that_fits_the_window_but_not_the_free_pages_waits_whole(make_engine):
    engine = make_engine(decode_pages=8)  # 128 tokens
    a = engine.submit([256] + [70] * 49, _params(40))  # 90 tokens: 6 pages
    b = engine.submit([256] + [80] * 29, _params(20))  # 50 tokens: 4 pages, only 2 left
    engine.step()
    assert a.state == RequestState.RUNNING and b.state == RequestState.WAITING
    assert engine.pool.used_pages == 6 and b.page_table is None
    engine.run_until_idle()
    assert len(a.output_ids) == 40 and len(b.output_ids) == 20
    alone = make_engine(decode_pages=8)
    b_alone = alone.submit(list(b.prompt_ids), _params(20))
    alone.run_until_idle()
    assert b.output_ids == b_alone.output_ids  # not truncated, not replaced: the same answer


@pytest.mark.parametrize(
    "prompt, params, fragment",
    [
        ([], _params(4), "the prompt is empty"),
        ([1, 2, 272], _params(4), "prompt token 2 = 272 is outside the vocabulary 0..271"),
        ([1, -1], _params(4), "prompt token 1 = -1 is outside the vocabulary"),
        ([1], SamplingParams(max_new_tokens=0), "max_new_tokens = 0 must be at least 1"),
        ([1], SamplingParams(temperature=-1.0), "temperature = -1.0 must be a finite number >= 0"),
        ([1], SamplingParams(top_p=0.0), "top_p = 0.0 must be in (0, 1]"),
        ([1], SamplingParams(top_k=-2), "top_k = -2 must be >= 0"),
    ],
)
def test_invalid_requests_are_refused_before_allocation(make_engine, prompt, params, fragment):
    engine = make_engine()
    with pytest.raises(InvalidRequest) as err:
        engine.submit(prompt, params, request_id="bad")
    assert fragment in str(err.value)
    _assert_nothing_allocated(engine, "bad")
    ok = engine.submit([1, 2], _params(2))  # the engine keeps serving
    engine.run_until_idle()
    assert ok.state == RequestState.FINISHED


def test_duplicate_live_request_id_is_refused(make_engine):
    engine = make_engine()
    engine.submit([1, 2], _params(3), request_id="x")
    with pytest.raises(InvalidRequest, match="request id 'x' is already in use"):
        engine.submit([1, 2], _params(3), request_id="x")
