"""Fair shares at admission, on a real engine: a client with hundreds of queued requests (each
within its budget) does not hold back another client's next request. First come, first served
reserved every request of the first client that was still queued before the second client's;
now clients take turns, so at most one of the first client's requests is reserved between the
second client's arrival and its reservation, however many the first has queued.

Asserted on the engine's own audit order (admitted, reserve_sent), never on a time; the
latencies are bench/fairness.py's."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.e2e  # real engine processes

QUEUED = 200  # the first client's requests, all admitted before the second client's one


def _time_of(audit: dict, event: str) -> float | None:
    return next((e["time"] for e in audit["events"] if e["event"] == event), None)


def test_a_client_with_many_queued_requests_does_not_hold_back_anothers_next_one(start_server):
    server = start_server()
    greedy, other = server.client(), server.client()
    streams = [greedy.submit([256, 7, i % 200 + 20, 9], max_new_tokens=48, ignore_eos=True) for i in range(QUEUED)]
    ids = [next(greedy.events(s, timeout_s=120)).get("request_id") for s in streams]  # all accepted
    stream = other.submit([256, 5, 6], max_new_tokens=8, ignore_eos=True)
    events = list(other.events(stream, timeout_s=300))
    assert events[-1].op == "done" and not events[-1].get("error")
    mine = other.audit(events[-1].get("request_id"))
    arrived, reserved = _time_of(mine, "admitted"), _time_of(mine, "reserve_sent")
    assert arrived is not None and reserved is not None
    between = []
    for rid in ids:
        sent = _time_of(greedy.audit(rid), "reserve_sent")
        if sent is not None and arrived < sent < reserved:
            between.append(rid)
    # (what is left of the first client's work ends with the server: a cancel here raced the
    # requests that finished meanwhile, "not running")
    # first come, first served: every one of the greedy client's requests still queued when the
    # other arrived (about QUEUED - 2 x max_batch) went first
    assert len(between) <= 1, f"{len(between)} of the other client's requests were reserved first"
