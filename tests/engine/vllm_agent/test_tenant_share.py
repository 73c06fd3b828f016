"""cross_tenant_share over plain snapshots, without vLLM (engine/vllm_agent/tenant_share.py):
one salt and one tenant share freely; unsalted tenants sharing is a configuration warning;
different salts on one block is a crossing. Salts never appear in clear.
tests/vllm/test_vllm_cross_tenant.py runs the same check inside a real vLLM."""

from __future__ import annotations

import json
import time

from engine.server.alerts import AlertBook
from engine.vllm_agent.agent_server import AgentServer
from engine.vllm_agent.checks import capacity_finding
from engine.vllm_agent.snapshot import BlockView, PoolSnapshot, RequestView
from engine.vllm_agent.tenant_share import KIND, SHARED_KIND, TenantShareCheck, salt_tag
from engine.wire.alert_kinds import BY_NAME
from tests.waiting import wait_for

BS = 32
SALT_A, SALT_B = "tenant-a-secret-9f2c", "tenant-b-secret-71de"
PREFIX = {b: bytes([b]) * 32 for b in range(1, 9)}  # blocks 1-4: the shared prefix's content hashes


def req(rid, blocks, salt=None, tenant=None):
    """A request holding `blocks` (full, with the prefix's hashes) and one private partial block."""
    full = tuple(blocks)
    return RequestView(rid, (*full, 100 + int(rid[1:])), len(full) * BS + 5, len(full) * BS + 5, 0,
                       tuple(PREFIX[b] for b in full), salt_tag=salt_tag(salt), tenant=tenant)


def snap(*requests, step=1):
    blocks = {}
    for r in requests:
        for b in r.block_ids:
            held = blocks.get(b)
            blocks[b] = BlockView((held.ref_cnt if held else 0) + 1, PREFIX.get(b))
    return PoolSnapshot(time.time(), step, 128, BS, {r.request_id: r for r in requests}, blocks)


def test_one_salt_and_one_tenant_share_freely_and_unmapped_unsalted_requests_too():
    # (a fresh check each: in vLLM a salted and an unsalted prefix never hash alike)
    assert TenantShareCheck().check(snap(req("r1", [1, 2, 3], SALT_A, "a"), req("r2", [1, 2, 3], SALT_A, "a"))) == []
    assert TenantShareCheck().check(snap(req("r3", [1, 2]), req("r4", [1, 2]))) == []  # no tenants declared
    assert TenantShareCheck().check(snap(req("r5", [1, 2], None, "a"), req("r6", [1, 2]))) == []  # one unmapped


def test_unsalted_requests_of_two_tenants_sharing_blocks_are_a_configuration_warning():
    [found] = TenantShareCheck().check(snap(req("r1", [1, 2, 3, 4], None, "acme"),
                                            req("r2", [1, 2, 3], None, "globex")))
    assert (found.kind, found.severity, found.subject) == (SHARED_KIND, "warning", "shared:blocks:1-3")
    assert found.pages == (1, 2, 3) and set(found.requests) == {"r1", "r2"}
    assert found.detail.startswith("prefix cache shared across tenants acme, globex: 3 vLLM block(s) [1-3]")
    assert "with no cache_salt" in found.detail and "up to 2 holding them at once" in found.detail


def test_a_later_request_of_another_tenant_hitting_a_finished_requests_cached_block_counts():
    """The hit is the side channel: tenant b's request reuses blocks a's finished request left."""
    check = TenantShareCheck()
    assert check.check(snap(req("r1", [1, 2, 3], None, "acme"), step=1)) == []
    [found] = check.check(snap(req("r2", [1, 2], None, "globex"), step=2))  # r1 is gone; r2 hit its blocks
    assert found.subject == "shared:blocks:1-2" and found.requests == ("r1", "r2")
    assert "each later one hit what an earlier, finished one left in the cache" in found.detail
    # the block refilled with other content has a new writer: nothing is inherited from r1
    other = RequestView("r3", (1,), 40, 40, 0, (b"\xee" * 32,), tenant="globex")
    refilled = PoolSnapshot(time.time(), 3, 128, BS, {"r3": other}, {1: BlockView(1, b"\xee" * 32)})
    assert check.check(refilled) == []


def test_the_detail_keeps_the_most_holders_seen_at_once_while_the_block_set_stays_in_view():
    check = TenantShareCheck()
    check.check(snap(req("r1", [1, 2], None, "acme"), req("r2", [1, 2], None, "globex"), step=1))
    [later] = check.check(snap(req("r2", [1, 2], None, "globex"), step=2))  # r1 finished first
    assert "up to 2 holding them at once" in later.detail and later.requests == ("r1", "r2")


def test_one_salt_given_to_two_tenants_is_the_configuration_warning_and_names_the_salt_only_hashed():
    [found] = TenantShareCheck().check(snap(req("r1", [1, 2], SALT_A, "acme"), req("r2", [1, 2], SALT_A, "globex")))
    assert found.severity == "warning" and f"under one cache_salt (sha256 {salt_tag(SALT_A)})" in found.detail
    assert SALT_A not in found.detail


def test_different_salts_on_one_block_are_a_crossing_naming_blocks_requests_and_hashed_salts():
    found = TenantShareCheck().check(snap(req("r1", [1, 2, 3], SALT_A, "acme"), req("r2", [1, 2, 3], SALT_B, "globex"),
                                          req("r3", [5], SALT_A, "acme")))
    [crossed] = found
    assert (crossed.kind, crossed.severity, crossed.subject) == (KIND, "critical", "crossed:blocks:1-3")
    assert crossed.pages == (1, 2, 3) and crossed.requests == ("r1", "r2")
    assert crossed.detail.startswith("data crossed tenants: 3 vLLM block(s) [1-3] reached by requests of different "
                                     "cache_salts")
    tag_a, tag_b = salt_tag(SALT_A), salt_tag(SALT_B)
    assert len(tag_a) == 8 and tag_a != tag_b
    assert f"r1 (tenant acme, salt sha256 {tag_a})" in crossed.detail
    assert f"r2 (tenant globex, salt sha256 {tag_b})" in crossed.detail
    assert SALT_A not in crossed.detail and SALT_B not in crossed.detail
    # a salted and an unsalted request never share in vLLM either: a crossing, tenants mapped or not
    [mixed] = TenantShareCheck().check(snap(req("r1", [1, 2], SALT_A), req("r2", [1, 2])))
    assert mixed.severity == "critical" and "r2 (no salt)" in mixed.detail


def test_block_sets_and_groups_make_one_finding_each_and_the_subject_spells_ranges():
    found = TenantShareCheck().check(snap(req("r1", [1, 2, 3, 6], None, "a"), req("r2", [1, 2, 3, 6], None, "b"),
                                          req("r3", [4], SALT_A, "c"), req("r4", [4], SALT_B, "c")))
    assert sorted(f.subject for f in found) == ["crossed:blocks:4", "shared:blocks:1-3,6"]


def test_the_agent_raises_one_episode_per_block_set_and_publishes_no_salt(tmp_path):
    """Through AgentServer's own thread and AlertBook: 20 snapshots of the same crossing are one
    alert episode (count 20), critical, crossed by its declaration; no salt in clear anywhere."""
    server = AgentServer("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", num_blocks=128, block_size=BS, facts={},
                         capacity=capacity_finding(512, 128, BS))
    try:
        for step in range(20):
            server.offer(snap(req("r1", [1, 2], SALT_A, "acme"), req("r2", [1, 2], SALT_B, "globex"), step=step))
            server.offer(snap(req("r5", [3], None, "acme"), req("r6", [3], None, "globex"), step=step))
        status = wait_for(lambda: (s := server.status()) and s["counters"].get("snapshots") == 40 and s, 10,
                          "40 snapshots folded")
    finally:
        server.close()
    alerts = {a["subject"]: a for a in status["alerts"] if a["kind"] in (KIND, SHARED_KIND)}
    assert set(alerts) == {"crossed:blocks:1-2", "shared:blocks:3"}
    crossed, shared = alerts["crossed:blocks:1-2"], alerts["shared:blocks:3"]
    assert (crossed["severity"], crossed["episode"], crossed["count"]) == ("critical", 1, 20)
    assert (shared["severity"], shared["episode"], shared["count"]) == ("warning", 1, 20)
    assert crossed["pages"] == [1, 2] and set(crossed["requests"]) == {"r1", "r2"}
    assert status["alert_episodes"][KIND] == 1 and status["counters"][f"alert:{KIND}"] == 20
    assert status["alert_episodes"][SHARED_KIND] == 1 and status["counters"][f"alert:{SHARED_KIND}"] == 20
    assert (crossed["kind"], shared["kind"]) == (KIND, SHARED_KIND)
    text = json.dumps(status)
    assert SALT_A not in text and SALT_B not in text
    kind = BY_NAME[KIND]
    assert kind.isolation and kind.detects_cross_reads and not kind.prevented_by_firing  # crossed="true"
    # a configuration finding is not a crossing: it must not page as PageWardenDataCrossed
    assert not BY_NAME[SHARED_KIND].isolation and not BY_NAME[SHARED_KIND].detects_cross_reads


def test_the_alert_book_takes_the_warning_below_the_kinds_usual_severity():
    book = AlertBook(lambda record: None)
    record = book.fire(KIND, "warning", "a crossing an operator lowered", subject="crossed:blocks:1")
    assert record["severity"] == "warning"
