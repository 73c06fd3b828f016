"""The isolation guard on a real server: faults need --allow-faults, the prompt log keeps a
hash and never the text, canaries fired on demand, and a canary leak caught."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from engine.client.engine_client import RemoteError
from engine.config import REPO_ROOT

pytestmark = pytest.mark.e2e  # real engine processes



def _cli(server, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "main.py", *argv, "--engine", server.control], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)


def _wait_finished(client, request_id: str, timeout_s: float = 120) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while True:
        events = [e["event"] for e in client.audit(request_id)["events"]]
        if {"finished", "failed"} & set(events):
            return events
        assert time.monotonic() < deadline, (request_id, events)
        time.sleep(0.2)


def test_faults_and_defences_off_are_refused_without_allow_faults(start_server):
    server = start_server()
    client = server.client()
    for changes, named in (({"faults": {"skip_scrub": True}}, "faults.skip_scrub"),
                           ({"defences": {"writer_tag_check": False}}, "defences.writer_tag_check")):
        with pytest.raises(RemoteError) as err:
            client.reconfigure(changes, apply=True)
        assert named in str(err.value) and "--allow-faults" in str(err.value)
    config = client.status()["config"]
    assert config["defences"]["writer_tag_check"] is True and config["faults"]["skip_scrub"] is False
    assert len(client.generate([256, 1, 2], max_new_tokens=3, ignore_eos=True)["token_ids"]) == 3  # still serving


def test_the_prompt_log_keeps_tenant_tier_length_and_hash_never_the_text(start_server):
    server = start_server()
    client = server.client()
    secret = "the launch code is PINEAPPLE-7731"
    client.generate(prompt=secret, max_new_tokens=2, tenant="acme", data_tier="confidential", request_id="p1")
    client.generate(prompt=secret, max_new_tokens=2, tenant="acme", request_id="p2")
    done = _cli(server, "submit", "--prompt", secret + "!", "--max-new-tokens", "2", "--tenant", "globex",
                "--data-tier", "public", "--request-id", "p3", "--json")
    assert done.returncode == 0, done.stderr
    entries = {e["request_id"]: e for e in client.call("prompt_log")["entries"]}
    p1, p2, p3 = entries["p1"], entries["p2"], entries["p3"]
    assert (p1["tenant"], p1["data_tier"], p3["tenant"], p3["data_tier"]) == ("acme", "confidential", "globex", "public")
    assert p2["data_tier"] is None
    assert p1["prompt_len"] == p2["prompt_len"] == p3["prompt_len"] - 1 > len(secret) // 2
    assert p1["prompt_hash"] == p2["prompt_hash"] != p3["prompt_hash"]
    assert p1["model"] and p1["time"] <= p2["time"] <= p3["time"]
    blob = json.dumps(client.call("prompt_log")) + json.dumps(client.audit("p1"))
    assert "PINEAPPLE" not in blob and "launch code" not in blob


def test_a_canary_fired_on_demand_runs_and_leaves_nothing_to_scope(start_server):
    server = start_server()
    client = server.client()
    fired = _cli(server, "canary", "--json")
    assert fired.returncode == 0, fired.stderr
    canary = json.loads(fired.stdout.strip().splitlines()[-1])
    assert canary["request_id"].startswith("canary-") and len(canary["marker"]) == 32
    assert "finished" in _wait_finished(client, canary["request_id"])
    (entry,) = [e for e in client.call("prompt_log")["entries"] if e["request_id"] == canary["request_id"]]
    assert entry["tenant"] == "canary" and entry["data_tier"] == "canary"
    scope = _cli(server, "scope", "--json")
    assert scope.returncode == 0 and json.loads(scope.stdout.strip().splitlines()[-1])["pairs"] == []
    assert "0 affected pair(s)" in _cli(server, "scope").stdout
    status = client.status()
    assert status["counters"]["canaries"] == 1
    assert not [a for a in status["alerts"] if a["kind"].startswith("canary")]


def test_a_request_whose_stale_table_names_a_canary_page_raises_canary_leak(start_server):
    # stale_block_table: the request's last page-table entry names the page the pool hands
    # out next, which the canary right behind it receives. The writer-tag check is on: the
    # request is aborted when it reaches that page, and the canary's page is what it met.
    # The victim reaches that page 24 decode steps in (40 + 40 tokens: its 5th page starts at
    # token 64), so the canary's prefill and transfer must land within those steps; with 20
    # new tokens (8 steps) a loaded machine let the victim get there first and meet a page
    # nobody had written yet (an ownership violation, rightly, but no canary in it).
    server = start_server("--allow-faults", faults={"stale_block_table": True})
    client = server.client()
    stream = client.submit([256] + [65] * 39, max_new_tokens=40, ignore_eos=True, request_id="victim-of-bug",
                           stream=False)
    canary = client.call("canary")
    error = None
    for msg in client.events(stream):
        if msg.op == "error":
            error = msg.get("error") or {}
        if msg.op in ("done", "error"):
            error = error or msg.get("error")
            break
    assert error and error["code"] == "ownership_violation", error
    _wait_finished(client, canary["request_id"])
    alerts = {a["kind"]: a for a in client.status()["alerts"]}
    leak = alerts.get("canary_leak")
    assert leak is not None, sorted(alerts)
    assert leak["requests"][:2] == [canary["request_id"], "victim-of-bug"] and leak["prevented"] is True
    assert "the read was masked" in leak["detail"]
    assert alerts["ownership_violation"]["prevented"] is True
