"""The vLLM agent's plain-Python core, without vLLM: the isolation checks, the page book and the
agent's sockets (real ZeroMQ on loopback). tests/vllm/ runs the same code inside a real vLLM."""

from __future__ import annotations

import time

import numpy as np
import pytest

from engine.client.engine_client import EngineClient, RemoteError
from engine.client.subscriber import TelemetrySubscriber
from engine.vllm_agent.agent_server import AgentServer
from engine.vllm_agent.checks import MAX_FINDINGS, capacity_finding, check_snapshot
from engine.vllm_agent.page_book import PageBook
from engine.vllm_agent.snapshot import BlockView, PoolSnapshot, RequestView
from engine.wire.page_tags import FREE_OWNER, PageState, unpack_tag

BS = 32
H = {name: bytes([i]) * 32 for i, name in enumerate(("a0", "a1", "b0", "b1", "c0"), start=1)}


def req(rid, blocks, tokens, hashes, prompt=None, rewound=False):
    return RequestView(rid, tuple(blocks), tokens, prompt or tokens, 0, tuple(H[h] for h in hashes), rewound=rewound)


def snap(requests, blocks, step=1, finished=None):
    return PoolSnapshot(time.time(), step, 16, BS, {r.request_id: r for r in requests},
                        {b: BlockView(ref, None if h is None else H[h]) for b, (ref, h) in blocks.items()},
                        finished or {})


def clean():
    # r1 and r2 share a prefix block (hash a0); each has its own second, partial block
    return snap([req("r1", [1, 2], 40, ["a0"]), req("r2", [1, 3], 50, ["a0"])],
                {1: (2, "a0"), 2: (1, None), 3: (1, None)})


def kinds(findings):
    return sorted((f.kind, f.subject) for f in findings)


def test_a_prefix_shared_full_block_with_each_holders_own_hash_is_clean():
    assert check_snapshot(clean()) == []


def test_a_block_with_another_requests_content_is_an_ownership_violation():
    s = snap([req("r1", [5, 2], 64, ["a0", "a1"]), req("r2", [4, 3], 64, ["b0", "b1"])],
             {5: (1, "b0"), 2: (1, "a1"), 4: (1, "a0"), 3: (1, "b1")})  # blocks 4 and 5 swapped
    found = check_snapshot(s)
    assert kinds(found) == [("ownership_violation", "block:4"), ("ownership_violation", "block:5")]
    five = next(f for f in found if f.subject == "block:5")
    assert five.requests == ("r1",) and five.pages == (5,) and "another request's data" in five.detail


def test_a_shared_partial_block_and_a_ref_count_below_the_holders_are_violations():
    s = snap([req("r1", [1, 2], 40, ["a0"]), req("r2", [1, 2], 40, ["a0"])], {1: (2, "a0"), 2: (2, None)})
    [shared] = check_snapshot(s)
    assert shared.subject == "block:2" and "not a full, hashed" in shared.detail
    s = snap([req("r1", [1, 2], 40, ["a0"]), req("r2", [1, 3], 50, ["a0"])], {1: (1, "a0"), 2: (1, None), 3: (1, None)})
    [under] = check_snapshot(s)
    assert under.subject == "block:1" and "ref_cnt 1" in under.detail and set(under.requests) == {"r1", "r2"}


def test_a_block_table_must_cover_exactly_the_computed_and_scheduled_tokens():
    s = snap([req("r1", [1, 2, 3], 40, ["a0"])], {1: (1, "a0"), 2: (1, None), 3: (1, None)})
    [extra] = check_snapshot(s)
    assert extra.kind == "block_table_mismatch" and "3 blocks" in extra.detail and "need 2" in extra.detail
    s = snap([req("r1", [1], 40, ["a0"])], {1: (1, "a0")})
    assert kinds(check_snapshot(s)) == [("block_table_mismatch", "request:r1")]


def test_a_request_vllm_rewound_after_a_failed_load_may_hold_more_blocks_never_fewer():
    # vLLM recomputes a failed load from its first failed block, keeping the 4 blocks it loaded into
    blocks = {1: (1, "a0"), 2: (1, None), 3: (1, None), 4: (1, None)}
    assert check_snapshot(snap([req("r1", [1, 2, 3, 4], 32, ["a0"], rewound=True)], blocks)) == []
    assert kinds(check_snapshot(snap([req("r1", [1, 2, 3, 4], 32, ["a0"])], blocks))) == [
        ("block_table_mismatch", "request:r1")]  # the same table, not rewound: a real mismatch
    short = snap([req("r1", [1], 40, ["a0"], rewound=True)], {1: (1, "a0")})
    assert kinds(check_snapshot(short)) == [("block_table_mismatch", "request:r1")]


def test_findings_per_snapshot_are_bounded():
    requests = [req(f"r{i}", [1, 2], 1, []) for i in range(200)]  # 200 tables a block too long, one shared block
    found = check_snapshot(snap(requests, {1: (200, None), 2: (200, None)}))
    assert len(found) == MAX_FINDINGS
    assert all(len(f.requests) <= 16 for f in found)


def test_capacity_uses_the_blocks_vllm_can_hand_out():
    assert capacity_finding(992, 32, 32)["exceeds"] is False  # vLLM 0.32's own limit for 32 blocks
    over = capacity_finding(4096, 32, 32)
    assert (over["exceeds"], over["limit_tokens"], over["shortfall_tokens"]) == (True, 992, 3104)
    assert "4,096" in over["message"] and "992" in over["message"]


def test_the_page_book_shows_owner_refs_writer_and_release():
    book = PageBook(16, BS)
    changed, records = book.apply(clean())
    assert changed.tolist() == [1, 2, 3]
    a = book.arrays
    r1, r2 = book.slots["r1"], book.slots["r2"]
    assert a["owner"][[1, 2, 3]].tolist() == [r1, r1, r2] and book.refs[[1, 2, 3]].tolist() == [2, 1, 1]
    assert a["filled"][[1, 2, 3]].tolist() == [32, 8, 18]
    assert (a["state"][[1, 2, 3]] == PageState.WRITTEN).all() and a["state"][0] == PageState.FREE
    assert {r["request_id"]: r["pages"] for r in records} == {"r1": {"vllm": 2}, "r2": {"vllm": 2}}
    # r1 finishes: block 1 stays with r2 (now its owner), block 2 is free and keeps its last writer
    changed, records = book.apply(snap([req("r2", [1, 3], 51, ["a0"])], {1: (1, "a0"), 3: (1, None)},
                                       finished={"r1": "length"}))
    assert changed.tolist() == [1, 2, 3]
    assert a["owner"][1] == r2 and book.refs[1] == 1 and a["owner"][2] == FREE_OWNER and book.refs[2] == 0
    assert unpack_tag(a["writer"][2]) == (r1, 1)
    assert [r["phase"] for r in records if r["request_id"] == "r1"] == ["finished"]
    # everyone leaves; a new request hits the cached prefix block 1: the writer is still r1
    book.apply(snap([], {}, finished={"r2": "stop"}))
    book.apply(snap([req("r3", [1, 4], 40, ["a0"])], {1: (1, "a0"), 4: (1, None)}))
    assert a["owner"][1] == book.slots["r3"] and a["epoch"][1] == 2 and unpack_tag(a["writer"][1]) == (r1, 1)
    assert unpack_tag(a["writer"][4]) == (book.slots["r3"], 1)


@pytest.fixture
def agent():
    server = AgentServer("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", num_blocks=16, block_size=BS,
                         facts={"vllm_version": "0.32.0"}, capacity=capacity_finding(4096, 16, BS))
    yield server
    server.close()


def test_the_agent_answers_viewer_ops_refuses_the_rest_and_publishes_pages_and_alerts(agent):
    with EngineClient(agent.control_endpoint) as client:
        status = client.status()
        assert status["engine"]["read_only"] and status["engine"]["name"] == "vLLM 0.32.0 (PageWarden agent)"
        assert [a["kind"] for a in status["alerts"]] == ["capacity_exceeds_window"]
        for op, fields in (("submit", {"prompt": "x"}), ("reconfigure", {"changes": {}}), ("stop", {"worker": "v"})):
            with pytest.raises(RemoteError) as refused:
                client.call(op, **fields)
            assert refused.value.code == "read_only" and f"'{op}' refused" in str(refused.value)
        sub = TelemetrySubscriber(status["engine"]["telemetry"], ("pages/", "alerts", "requests", "metrics"))
        try:
            deadline = time.monotonic() + 10
            while not agent.telemetry.wants_pages() and time.monotonic() < deadline:
                time.sleep(0.05)
            client.keyframe()
            agent.offer(clean())
            broken = snap([req("r1", [5, 2], 64, ["a0", "a1"])], {5: (1, "b0"), 2: (1, "a1")}, step=2)
            agent.offer(broken)
            seen = {}
            while time.monotonic() < deadline and not ({"keyframe", "alerts", "metrics"} <= set(seen)):
                msg = sub.recv(0.2)
                if msg is not None:
                    seen[msg.get("kind") if msg.topic == "pages/vllm" else msg.topic] = msg
        finally:
            sub.close()
    keyframe = seen["keyframe"]
    assert keyframe.get("num_pages") == 16 and "refs" in keyframe.arrays
    assert seen["alerts"].get("kind") == "ownership_violation" and seen["alerts"].get("pages") == [5]
    assert np.asarray(keyframe.arrays["refs"]).dtype == np.int32
    metrics = seen["metrics"]
    assert metrics.get("pools") == {"vllm": {"role": "vllm", "pages": 16,  # as the engine's `load` says it
                                             "used_pages": metrics.get("pools")["vllm"]["used_pages"]}}
    assert {"tokens_per_s", "running", "queue_depth"} <= set(metrics.header)


def test_pause_is_refused_as_read_only_unless_faults_are_allowed_and_then_blinds_the_agent(agent, monkeypatch):
    with EngineClient(agent.control_endpoint) as client:
        monkeypatch.delenv("PAGEWARDEN_ALLOW_FAULTS", raising=False)
        with pytest.raises(RemoteError) as refused:
            client.call("pause", paused=True)
        assert refused.value.code == "read_only" and not agent.paused
        monkeypatch.setenv("PAGEWARDEN_ALLOW_FAULTS", "1")
        with pytest.raises(RemoteError) as bad:
            client.call("pause", paused="yes")
        assert bad.value.code == "bad_message" and "'yes'" in str(bad.value) and not agent.paused
        assert client.call("pause", paused=True) == {"paused": True}
        assert agent.paused and client.status()["engine"]["agent_paused"] is True
        assert client.call("pause", paused=False) == {"paused": False}
        assert not agent.paused and client.status()["engine"]["agent_paused"] is False
        cost = client.status()["cost"]
        assert set(cost) == {"scheduler_s", "thread_cpu_s"} and cost["thread_cpu_s"] > 0
