"""The poison scrub (NaN into freed pages, K and V) must never reach a later request's
output: every slot a reader may not use is masked before attention, in K as in V."""

from __future__ import annotations

from engine.request import SamplingParams


def test_reused_poisoned_pages_do_not_change_anyones_tokens(make_engine):
    """A first request's pages are freed and poisoned; a batch of two then reuses them, with
    slots past each sequence's end still NaN. Its tokens must be those of the zero scrub.
    Before K's blocked slots were zeroed too, the poisoned run's tokens collapsed to 0."""
    params = SamplingParams(max_new_tokens=6, ignore_eos=True)
    outputs = {}
    for scrub in ("zero", "poison"):
        engine = make_engine(prefill_pages=8, decode_pages=8, scrub_policy=scrub, kernels="torch")
        engine.generate([list(range(40, 77))], params)
        requests = engine.generate([[10, 11, 10, 11, 10], [3, 3, 3]], params)
        outputs[scrub] = [r.output_ids for r in requests]
    assert outputs["poison"] == outputs["zero"]
