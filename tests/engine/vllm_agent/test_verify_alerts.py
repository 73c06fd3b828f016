"""A failed transfer check as the agent shows it, without vLLM: a transfer_mismatch alert naming
the request, blocks, expected and found digests, and the blocks QUARANTINED until rewritten."""

from __future__ import annotations

import time

from engine.client.engine_client import EngineClient
from engine.vllm_agent.agent_server import AgentServer
from engine.vllm_agent.checks import capacity_finding
from engine.vllm_agent.page_book import PageBook
from engine.wire.page_tags import PageState
from tests.engine.vllm_agent.test_agent_core import BS, req, snap
from tests.waiting import wait_for


def test_quarantined_blocks_stay_so_until_two_snapshots_show_them_held_or_they_are_freed():
    book = PageBook(16, BS)
    state = book.arrays["state"]
    book.apply(snap([req("r1", [5, 6], 64, ["a0", "a1"]), req("r2", [7], 32, ["b0"])],
                    {5: (1, "a0"), 6: (1, "a1"), 7: (1, "b0")}))
    assert book.quarantine([6, 7, 99]).tolist() == [6, 7]  # an id outside the pool is ignored
    assert state[6] == state[7] == PageState.QUARANTINED
    # the step that schedules the recompute: still quarantined; r2 leaves, its block is freed
    changed, _ = book.apply(snap([req("r1", [5, 6], 64, ["a0", "a1"])], {5: (1, "a0"), 6: (1, "a1")}, step=2))
    assert state[6] == PageState.QUARANTINED and state[7] == PageState.FREE and 7 in changed.tolist()
    changed, _ = book.apply(snap([req("r1", [5, 6], 65, ["a0", "a1"])], {5: (1, "a0"), 6: (1, "a1")}, step=3))
    assert state[6] == PageState.WRITTEN and 6 in changed.tolist() and not book.quarantined


def test_offer_alert_raises_transfer_mismatch_on_the_agents_thread_and_quarantines_its_blocks():
    agent = AgentServer("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", num_blocks=16, block_size=BS,
                        facts={"vllm_version": "0.32.0"}, capacity=capacity_finding(256, 16, BS))
    try:
        agent.offer(snap([req("r1", [5, 6], 64, ["a0", "a1"])], {5: (1, "a0"), 6: (1, "a1")}))
        agent.offer_alert("transfer_mismatch", "request r1: 1 of 2 loaded block(s) failed", subject="request:r1",
                          requests=("r1",), pages=(6,), expected=["00000000000000aa"], found=["00000000000000bb"],
                          reason="digest mismatch", prevented=True)
        with EngineClient(agent.control_endpoint) as client:
            status = wait_for(lambda: (s := client.status()) and s["alerts"] and s, timeout_s=10, what="the alert")
            [alert] = status["alerts"]
            assert (alert["kind"], alert["requests"], alert["pages"]) == ("transfer_mismatch", ["r1"], [6])
            assert alert["expected"] == ["00000000000000aa"] and alert["found"] == ["00000000000000bb"]
            assert alert["prevented"] is True and alert["severity"] == "critical"
            assert status["counters"]["findings:transfer_mismatch"] == 1
        time.sleep(0.1)
        assert agent.book.arrays["state"][6] == PageState.QUARANTINED
    finally:
        agent.close()
