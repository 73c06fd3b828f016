"""The salt check (`probe --salt-check`) against a real vLLM 0.32 (CPU build, the copy
model, prefix caching on, --enable-prompt-tokens-details so usage carries cached_tokens):
vLLM keeps cache_salt values apart, so the check says "salt isolation holds", judged by
cached_tokens; told to drop the salt from the different pairs (a router that loses the
field), the same vLLM shares those prefixes and the check says "cache shared across salts".
One vLLM for both (a start takes a minute or more here). Each test prints its report."""

from __future__ import annotations

import pytest

from engine.adapters.salt_check import HOLDS, SHARED, open_salt_check
from tests.vllm.vllm_server import VllmServer

PAIRS = 8


@pytest.fixture(scope="module")
def vllm_with_token_details():
    with VllmServer(max_model_len=2048, num_blocks=256, prefix_caching=True,
                    extra_args=("--enable-prompt-tokens-details",)) as server:
        yield server


def show(report) -> None:
    print("\n" + "\n".join(report.lines()))
    for p in report.pairs:
        print(f"  pair {p.number} {p.kind}: cold {p.cold_ttft_s * 1000:.1f} ms cached {p.cold_cached}, "
              f"second {p.second_ttft_s * 1000:.1f} ms cached {p.second_cached} (prompt {p.prompt_tokens})")


def test_vllm_keeps_salts_apart(vllm_with_token_details):
    report = open_salt_check(vllm_with_token_details.url, pairs=PAIRS, rate=10.0).run()
    show(report)
    assert report.counts_reported, report.lines()
    assert report.verdict == HOLDS, report.lines()
    assert report.same_hits == PAIRS and report.different_hits == 0 and report.cold_hits == 0
    same = [p for p in report.pairs if p.kind == "same"]
    # vLLM reuses whole blocks of 32 (the CPU build's block size) of the 1,000-token prefix
    assert all(p.second_cached % 32 == 0 and p.second_cached >= 900 for p in same), report.lines()


def test_a_dropped_salt_is_seen_shared(vllm_with_token_details):
    report = open_salt_check(vllm_with_token_details.url, pairs=PAIRS, rate=10.0, no_salt=True).run()
    show(report)
    assert report.verdict == SHARED, report.lines()
    assert report.different_hits == PAIRS and report.same_hits == PAIRS and report.cold_hits == 0
