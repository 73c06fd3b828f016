"""`main.py snapshot` against a real engine: every file present and valid, no prompt text,
bad arguments and an absent engine refused with a clear message."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
import zipfile

import pytest

from engine.config import REPO_ROOT
from gui.snapshot.bundle import read_bundle
from gui.snapshot.schema import validate

pytestmark = pytest.mark.e2e  # real engine processes

TRACE_PHASES = {"X", "i", "I", "M", "B", "E", "b", "e", "n", "C"}


def _cli(*argv: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "main.py", *argv], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_snapshot_cli_writes_a_complete_valid_bundle(start_server, tmp_path):
    server = start_server()
    client = server.client()
    secret = "my bank password is HUNTER2-XYZZY"
    client.generate(prompt=secret, max_new_tokens=6, tenant="acme", request_id="s1")
    client.generate([256, 5, 6, 7], max_new_tokens=4, tenant="globex", request_id="s2")
    canary = client.call("canary")
    out = tmp_path / "snap.zip"
    done = _cli("snapshot", "--engine", server.control, "--out", str(out), "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["warnings"] == [] and summary["affected"] == []
    opened = read_bundle(out)
    with zipfile.ZipFile(out) as zf:
        members = {name: zf.read(name) for name in zf.namelist()}
    pools = [w["pool"]["name"] for w in client.status()["workers"]]
    assert set(members) == {"manifest.json", "state.json", "pages.npz", "metrics.csv", "events.jsonl", "trace.json",
                            "report.html", *(f"pagemap-{p}.png" for p in pools)}
    # schemas
    assert validate("manifest.json", json.loads(members["manifest.json"])) == []
    assert validate("state.json", json.loads(members["state.json"])) == []
    lines = members["events.jsonl"].decode().splitlines()
    assert lines and all(validate("events.jsonl", json.loads(line)) == [] for line in lines)
    assert {json.loads(line)["topic"] for line in lines} >= {"requests", "metrics"}
    # the requests and their lifecycle are there; the prompt text is nowhere, the canary marker is allowed
    requests = {r["request_id"]: r for r in opened.state["requests"]}
    assert {"s1", "s2"} <= set(requests) and requests["s1"]["tenant"] == "acme"
    assert [e["event"] for e in requests["s2"]["events"]][:1] == ["admitted"]
    assert "finished" in [e["event"] for e in requests["s2"]["events"]]
    everything = b"".join(members.values())
    assert b"HUNTER2" not in everything and b"bank password" not in everything
    assert canary["request_id"] in requests
    # trace: Chrome trace events with request spans on worker tracks
    trace = json.loads(members["trace.json"])
    events = trace["traceEvents"]
    assert events and {e["ph"] for e in events} <= TRACE_PHASES
    spans = [e for e in events if e["ph"] == "X" and e.get("args", {}).get("request_id") == "s2"]
    assert len(spans) >= 3 and all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
    # metrics.csv has a header and rows; report.html says nothing was affected
    rows = list(csv.reader(io.StringIO(members["metrics.csv"].decode())))
    assert rows[0][:2] == ["time", "tokens_per_s"] and len(rows) >= 2
    report = members["report.html"].decode()
    assert "No cross-request reads" in report and "<script" not in report.lower()
    assert all(f["sha256"] in report for f in opened.manifest["files"] if f["name"] != "report.html")
    assert members["pagemap-" + pools[0] + ".png"][:8] == b"\x89PNG\r\n\x1a\n"


def test_snapshot_cli_refuses_bad_arguments_and_an_absent_engine(tmp_path):
    bad_since = _cli("snapshot", "--out", str(tmp_path / "a.zip"), "--since", "-5")
    assert bad_since.returncode == 2 and "--since -5.0 must be a positive number of minutes" in bad_since.stderr
    bad_out = _cli("snapshot", "--out", str(tmp_path / "a.tar"))
    assert bad_out.returncode == 2 and "must name a .zip file" in bad_out.stderr
    absent = _cli("snapshot", "--engine", "tcp://127.0.0.1:9", "--timeout", "2", "--out", str(tmp_path / "b.zip"))
    assert absent.returncode == 1 and "error:" in absent.stderr
    assert not list(tmp_path.iterdir())  # nothing half-written
