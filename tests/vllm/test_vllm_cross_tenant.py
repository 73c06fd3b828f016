"""cross_tenant_share inside a real vLLM 0.32 (CPU build), one server for every case: the agent
maps each request to its tenant by a key of its `vllm_xargs` (tenant_field), and reads its
cache_salt. Unsalted tenants sharing a prefix is the configuration warning; per-tenant salts
keep them apart; a hash that drops the salt (test fault salt_ignored, asked per request) shares
blocks across salts, and the agent calls that data crossing tenants."""

from __future__ import annotations

import concurrent.futures as cf
import json
import time
import urllib.request

import pytest

from engine.client.engine_client import EngineClient
from engine.vllm_agent.tenant_share import KIND, SHARED_KIND, salt_tag
from engine.vllm_agent.test_faults import TEST_KEY
from tests.vllm.vllm_server import VllmServer
from tests.waiting import wait_for

pytestmark = pytest.mark.vllm
BLOCK = 32
NEW_TOKENS = 280  # long enough that the second request starts while the first still decodes
PREFIXES = {  # one per case, so that no case hits another's cached blocks; ~175 bytes: 5 full blocks
    "unsalted": "the quick brown fox jumps over the lazy dog while the river runs north past the mill " * 2,
    "salted": "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt " * 2,
    "fault": "river stone light cloud north south green amber copper violet iron salt wind and rain " * 2,
}
SALTS = {"acme": "acme-7f3e9c1d-secret-salt", "globex": "globex-52ab04e6-secret-salt"}


@pytest.fixture(scope="module")
def vllm():
    with VllmServer(agent={"tenant_field": "tenant", "test_fault": "salt_ignored"},
                    env={"PAGEWARDEN_ALLOW_FAULTS": "1"}, extra_args=("--enable-prompt-tokens-details",),
                    num_blocks=128, block_size=BLOCK, max_model_len=512) as server:
        yield server


def complete(server: VllmServer, request_id: str, prompt: str, xargs: dict, salt: str | None = None) -> dict:
    body = {"model": "pagewarden-copy", "prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0,
            "ignore_eos": True, "vllm_xargs": xargs, **({"cache_salt": salt} if salt else {})}
    req = urllib.request.Request(f"{server.url}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json", "X-Request-Id": request_id})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


def overlapping(server: VllmServer, asks: list[tuple]) -> list[dict]:
    """Each ask (request id, prompt, xargs, salt) 50 ms after the one before: usually all in
    flight at once, not always (see how_shared)."""
    with cf.ThreadPoolExecutor(len(asks)) as pool:
        futures = []
        for ask in asks:
            futures.append(pool.submit(complete, server, *ask))
            time.sleep(0.05)
        return [f.result() for f in futures]


def how_shared(detail: str) -> str:
    """Whether the two requests held the blocks at the same time or the later one hit what the
    earlier left behind: the 50 ms spacing usually overlaps them, but under load the first can
    finish before the second is scheduled. Both are the same finding (each wording is checked
    in tests/engine/vllm_agent/test_tenant_share.py); exactly one must be said."""
    at_once = "up to 2 holding them at once" in detail
    after = "each later one hit what an earlier, finished one left" in detail
    assert at_once != after, detail
    return "at once" if at_once else "one after the other"


def cached(reply: dict) -> int:
    return int(((reply.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


def alerts_naming(status: dict, ids: list[str]) -> list[dict]:
    """The agent's alerts naming any of our requests (vLLM's ids are ours plus -0-<random>)."""
    return [a for a in status["alerts"] if any(rid.startswith(f"cmpl-{i}-") for rid in a["requests"] for i in ids)]


def test_unsalted_tenants_sharing_a_prefix_are_flagged_as_a_shared_prefix_cache(vllm):
    prompt = PREFIXES["unsalted"]
    ids = ["ct1-acme", "ct1-globex"]
    replies = overlapping(vllm, [(ids[0], prompt + " acme asks one", {"tenant": "acme"}, None),
                                 (ids[1], prompt + " globex asks two", {"tenant": "globex"}, None)])
    assert cached(replies[1]) >= 4 * BLOCK  # vLLM's own count: globex's request hit acme's cached prefix
    with EngineClient(vllm.agent_control) as client:
        status = wait_for(lambda: (s := client.status()) and alerts_naming(s, ids) and s, 30, "a cross_tenant_share")
    [alert] = alerts_naming(status, ids)
    print(f"\nunsalted: cached_tokens={cached(replies[1])} blocks={alert['pages']}\n  {alert['detail']}")
    assert (alert["kind"], alert["severity"]) == (SHARED_KIND, "warning")
    assert alert["detail"].startswith("prefix cache shared across tenants acme, globex: ")
    assert alert["subject"].startswith("shared:blocks:") and len(alert["pages"]) >= 4
    assert len(alert["requests"]) == 2 and alert["episode"] == 1
    print(f"  held {how_shared(alert['detail'])}")


def test_per_tenant_salts_keep_the_tenants_apart_and_one_tenant_still_shares(vllm):
    prompt = PREFIXES["salted"]
    ids = ["ct2-acme-1", "ct2-globex", "ct2-acme-2"]
    replies = overlapping(vllm, [(ids[0], prompt + " acme asks one", {"tenant": "acme"}, SALTS["acme"]),
                                 (ids[1], prompt + " globex asks two", {"tenant": "globex"}, SALTS["globex"]),
                                 (ids[2], prompt + " acme asks three", {"tenant": "acme"}, SALTS["acme"])])
    assert cached(replies[1]) == 0  # globex's salt: no hit on acme's prefix
    assert cached(replies[2]) >= 4 * BLOCK  # acme's second request, same salt: it hit its own tenant's prefix
    print(f"\nsalted: cached_tokens globex={cached(replies[1])} acme-2={cached(replies[2])}")
    with EngineClient(vllm.agent_control) as client:
        wait_for(lambda: client.status()["workers"][0]["pool"]["used_pages"] == 0, 30, "every block released")
        time.sleep(0.5)  # a snapshot period and then some: every finding of these requests is in
        status = client.status()
    assert alerts_naming(status, ids) == []
    assert not any(a["kind"] not in (KIND, SHARED_KIND) for a in status["alerts"]), status["alerts"]


def test_a_hash_that_drops_the_salt_shares_blocks_across_salts_and_the_agent_calls_it_crossed(vllm):
    prompt = PREFIXES["fault"]
    ids = ["ct3-acme", "ct3-globex"]
    fault = {TEST_KEY: "salt_ignored"}
    replies = overlapping(vllm, [
        (ids[0], prompt + " acme asks one", {"tenant": "acme", **fault}, SALTS["acme"]),
        (ids[1], prompt + " globex asks two", {"tenant": "globex", **fault}, SALTS["globex"])])
    assert cached(replies[1]) >= 4 * BLOCK  # the fault works: vLLM itself shared acme's prefix with globex
    with EngineClient(vllm.agent_control) as client:
        status = wait_for(lambda: (s := client.status()) and alerts_naming(s, ids) and s, 30, "a crossing")
    [alert] = alerts_naming(status, ids)
    print(f"\nfault: cached_tokens={cached(replies[1])} blocks={alert['pages']}\n  {alert['detail']}")
    assert (alert["kind"], alert["severity"]) == (KIND, "critical")
    assert alert["detail"].startswith("data crossed tenants: ") and alert["subject"].startswith("crossed:blocks:")
    assert len(alert["pages"]) >= 4 and len(alert["requests"]) == 2
    print(f"  held {how_shared(alert['detail'])}")
    for tenant, salt in SALTS.items():
        assert f"tenant {tenant}, salt sha256 {salt_tag(salt)}" in alert["detail"]
    text = json.dumps(status)
    assert not any(salt in text for salt in SALTS.values())  # a salt is a secret: never in clear
    # the fault moves no block: the other checks stay quiet (the hashes match each holder's own)
    assert {a["kind"] for a in status["alerts"]} <= {KIND, SHARED_KIND}
