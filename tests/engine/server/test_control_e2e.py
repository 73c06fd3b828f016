"""Reconfigure validates first and reports the capacity consequence; applying is live for
live settings and drains-and-restarts workers for structural ones."""

from __future__ import annotations

import os
import time

import pytest

from engine.client import RemoteError

pytestmark = pytest.mark.e2e  # real engine processes



def test_reconfigure_validates_reports_and_applies(start_server):
    server = start_server(engine={"context_window": 2048}, pools={"prefill": {"pages": 256}, "decode": {"pages": 256}})
    client = server.client()
    before = client.status()["config"]

    assert not [a for a in client.status()["alerts"] if a["kind"] == "capacity_exceeds_window"]
    dry = client.reconfigure({"engine": {"context_window": 8192}})
    assert dry["valid"] and not dry["applied"] and dry["exceeds"]
    prefill = next(f for f in dry["findings"] if f["limit"] == "pool:prefill")
    assert prefill["limit_tokens"] == 4096 and prefill["shortfall_tokens"] == 4096
    assert any("exceeds the prefill pool" in line for line in dry["consequence"])
    assert client.status()["config"] == before  # nothing applied

    with pytest.raises(RemoteError, match="engine.page_size = 3 must be a power of two") as err:
        client.reconfigure({"engine": {"page_size": 3}}, apply=True)
    assert err.value.code == "config_error"
    with pytest.raises(RemoteError, match="unknown key 'engine.window'"):
        client.reconfigure({"engine": {"window": 3}})
    with pytest.raises(RemoteError, match="strict capacity refuses"):
        client.reconfigure({"engine": {"strict_capacity": True, "context_window": 8192}}, apply=True)

    # applied: the standing finding becomes a firing condition alert, then resolves when fixed
    assert client.reconfigure({"engine": {"context_window": 8192}}, apply=True)["applied"]
    alert = next(a for a in client.status()["alerts"] if a["id"] == "capacity_exceeds_window:pool:prefill")
    assert alert["state"] == "firing" and alert["shortfall_tokens"] == 4096
    assert client.ack_alert([alert["id"]])["acknowledged"] == [alert["id"]]
    client.reconfigure({"engine": {"context_window": 2048}}, apply=True)
    alert = next(a for a in client.status()["alerts"] if a["id"] == "capacity_exceeds_window:pool:prefill")
    assert alert["state"] == "resolved" and alert["acked"] is True

    live = client.reconfigure({"engine": {"max_batch": 4, "scrub_policy": "poison"}}, apply=True)
    assert live["applied"] and live["restart"] == []
    status = client.status()
    assert status["config"]["engine"]["max_batch"] == 4
    assert all(w["state"] == "ready" for w in status["workers"])

    pids = {w["name"]: w["pid"] for w in status["workers"]}
    structural = client.reconfigure({"pools": {"decode": {"pages": 300}}}, apply=True)
    assert structural["restart"] == ["decode-0"]
    status = server.wait_workers(client)
    decode = next(w for w in status["workers"] if w["name"] == "decode-0")
    assert decode["pool"]["pages"] == 300 and decode["pid"] != pids["decode-0"]
    assert next(w for w in status["workers"] if w["name"] == "prefill-0")["pid"] == pids["prefill-0"]
    done = client.generate([256, 4, 5], max_new_tokens=3, ignore_eos=True)
    assert len(done["token_ids"]) == 3

    # compute threads: on CPU, the copy model is too small to share the cores (a model that is
    # shares them: test_core_share_e2e), so each worker has a fixed part unless set; a change
    # restarts each
    part = max(1, len(os.sched_getaffinity(0)) // 2)
    assert [(w["threads"], w["threads_shared"]) for w in status["workers"]] == [(part, False)] * 2
    # and says what its decode attention runs on (the C++ module is built here and in CI)
    assert all(w["attention"].startswith("in place, C++") for w in status["workers"]), status["workers"]
    threads = client.reconfigure({"workers": {"threads": 3}}, apply=True)
    assert sorted(threads["restart"]) == ["decode-0", "prefill-0"]
    deadline = time.monotonic() + 120
    while [(w["state"], w["threads"], w["threads_shared"])
           for w in client.status()["workers"]] != [("ready", 3, False)] * 2:
        assert time.monotonic() < deadline, client.status()["workers"]
        time.sleep(0.2)
    with pytest.raises(RemoteError, match="workers.threads = 2,000 is out of range: must be between 0 and 1,024"):
        client.reconfigure({"workers": {"threads": 2000}})


def test_status_cli_and_submit_cli(start_server):
    import json
    import subprocess
    import sys

    from engine.config import REPO_ROOT

    server = start_server()

    def cli(*argv):
        return subprocess.run([sys.executable, "main.py", *argv, "--engine", server.control], cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=120)

    status = cli("status", "--json")
    assert status.returncode == 0, status.stderr
    workers = json.loads(status.stdout.strip().splitlines()[-1])["workers"]
    assert {(w["name"], w["role"], w["state"]) for w in workers} == {("prefill-0", "prefill", "ready"),
                                                                    ("decode-0", "decode", "ready")}
    assert all(isinstance(w["pid"], int) for w in workers)
    submit = cli("submit", "--prompt-ids", "256,72,105", "--max-new-tokens", "5", "--ignore-eos", "--json")
    assert submit.returncode == 0, submit.stderr
    result = json.loads(submit.stdout.strip().splitlines()[-1])
    generate = subprocess.run([sys.executable, "main.py", "generate", "--prompt-ids", "256,72,105",
                               "--max-new-tokens", "5", "--ignore-eos", "--json"],
                              cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result["token_ids"] == json.loads(generate.stdout.strip().splitlines()[-1])["token_ids"]
    assert isinstance(result["text"], str)
    streamed = cli("submit", "--prompt", "Hello", "--max-new-tokens", "4", "--ignore-eos")
    assert streamed.returncode == 0 and "[4 tokens, finish=length" in streamed.stderr
    too_long = cli("submit", "--prompt-ids", "1,2", "--max-new-tokens", "5000", "--json")
    assert too_long.returncode == 1 and "context window is 2,048 tokens" in too_long.stderr
    stop = cli("workers", "stop", "decode-0")
    assert stop.returncode == 0 and "decode-0: stopping" in stop.stdout
    listed = cli("workers", "--json")
    assert listed.returncode == 0
