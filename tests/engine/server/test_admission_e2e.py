"""I2 on the real server: a request that cannot fit the smaller pool is rejected before
any worker hears of it — no reservation, no prefill, no transfer."""

from __future__ import annotations

import time

import pytest

from engine.client import RemoteError

pytestmark = pytest.mark.e2e  # real engine processes


WORKER_EVENTS = {"reserve_sent", "reserved", "prefill_sent", "prefilled", "transfer_done"}


def test_boundaries_of_both_pools(start_server):
    # prefill pool 4 x 16 = 64 tokens (the prompt); decode pool 8 x 16 = 128 (the whole request)
    server = start_server(engine={"context_window": 1024}, pools={"prefill": {"pages": 4}, "decode": {"pages": 8}})
    client = server.client()
    cases = {  # request id: (prompt length, max_new_tokens, admitted)
        "prefill-cap-minus-1": (63, 2, True), "prefill-cap": (64, 2, True), "prefill-cap-plus-1": (65, 2, False),
        "decode-cap-minus-1": (60, 67, True), "decode-cap": (60, 68, True), "decode-cap-plus-1": (60, 69, False),
    }
    accepted = []
    for rid, (prompt_len, new, admitted) in cases.items():
        prompt = [256] + [65] * (prompt_len - 1)
        if admitted:
            done = client.generate(prompt, max_new_tokens=new, ignore_eos=True, request_id=rid)
            assert len(done["token_ids"]) == new  # never truncated
            accepted.append(rid)
            continue
        with pytest.raises(RemoteError) as err:
            client.generate(prompt, max_new_tokens=new, ignore_eos=True, request_id=rid)
        assert err.value.code == "admission_rejected"
        pool = rid.split("-")[0]
        needed = prompt_len if pool == "prefill" else prompt_len + new
        limit = 64 if pool == "prefill" else 128
        assert f"the {pool} pool must hold {needed} of its {prompt_len + new} tokens" in str(err.value)
        assert f"holds {limit} tokens" in str(err.value)
    for rid in cases:
        events = {e["event"] for e in client.audit(rid)["events"]}
        if rid in accepted:
            assert WORKER_EVENTS <= events, (rid, events)
        else:
            # no worker ever heard of it; the supervisor raised the rejection as an alert
            assert events == {"rejected", "alert:admission_rejected"}, (rid, events)
    # worker stats come with heartbeats (every 0.5 s): wait for the one after the last request
    deadline = time.monotonic() + 15
    while True:
        status = client.status()
        decode = next(w for w in status["workers"] if w["role"] == "decode")
        if decode["stats"]["transfers"]["complete"] >= len(accepted) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert decode["stats"]["transfers"]["complete"] == len(accepted)
    assert sum(decode["stats"]["transfers"].values()) == len(accepted)  # not one chunk for a rejected id
    assert status["counters"]["rejected"] == 2 and status["counters"]["transfers_ok"] == len(accepted)
