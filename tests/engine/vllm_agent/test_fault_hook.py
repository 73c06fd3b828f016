"""The vLLM side's one test hook (engine/vllm_agent/test_faults.py), without vLLM: a fault is
refused unless the process allows faults, and a request's own params choose nothing unless
the consumer was started to let them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from engine.vllm_agent import test_faults as tf


def test_a_fault_is_refused_without_the_variable_and_an_unknown_one_always(monkeypatch):
    monkeypatch.delenv(tf.ALLOW_ENV, raising=False)
    tf.refuse_unless_allowed(None, tf.AGENT_FAULTS, "x")  # none configured: nothing to refuse
    with pytest.raises(ValueError, match=r"'swap_block' refused: .*PAGEWARDEN_ALLOW_FAULTS=1"):
        tf.refuse_unless_allowed("swap_block", tf.AGENT_FAULTS, "x")
    monkeypatch.setenv(tf.ALLOW_ENV, "1")
    tf.refuse_unless_allowed("short_transfer", tf.TRANSFER_FAULTS, "x")
    with pytest.raises(ValueError, match="one of short_transfer, per_request"):
        tf.refuse_unless_allowed("swap_block", tf.TRANSFER_FAULTS, "x")


def test_only_a_per_request_consumer_lets_a_request_choose():
    asks = {tf.TEST_KEY: {"fault": True, "verify": False}}
    assert tf.switches(None, True, asks) == (True, False)  # production: the request's ask is ignored
    assert tf.switches("short_transfer", True, asks) == (True, True)
    assert tf.switches("per_request", True, asks) == (False, True)
    assert tf.switches("per_request", True, {tf.TEST_KEY: "junk"}) == (True, False)
    assert tf.switches("per_request", False, {tf.TEST_KEY: {"verify": True}}) == (False, False)  # never turns on


def test_a_short_transfer_never_leaves_the_first_block_unwritten():
    assert tf.unwritten_blocks("r", [7, 8, 9, 10], 2) == [9, 10]
    assert tf.unwritten_blocks("r", [7, 8], 5) == [8]
    assert tf.unwritten_blocks("r", [7], 2) == []


def test_salt_ignored_drops_the_salt_from_the_hash_keys_of_requests_that_ask_only():
    """On a stand-in for vllm.v1.core.kv_cache_utils: the salt goes only where the request asks."""
    def real(request, start, end, mm_idx):
        return ((("lora", "x", "p"),) if request.lora else ()) + \
            ((("cache_salt", request.cache_salt),) if start == 0 and request.cache_salt else ()) or None, mm_idx

    utils = SimpleNamespace(generate_block_hash_extra_keys=real)
    tf.ignore_salt_when_asked(utils)

    def keys(salt, lora=False, **xargs):
        request = SimpleNamespace(cache_salt=salt, lora=lora, sampling_params=SimpleNamespace(extra_args=xargs or None))
        return utils.generate_block_hash_extra_keys(request, 0, 32, 0)[0]

    assert keys("s") == (("cache_salt", "s"),)  # not asked: vLLM's own keys
    assert keys("s", **{tf.TEST_KEY: "salt_ignored"}) is None
    assert keys("s", lora=True, **{tf.TEST_KEY: "salt_ignored"}) == (("lora", "x", "p"),)  # other keys stay
