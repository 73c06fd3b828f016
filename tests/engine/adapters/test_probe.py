"""`probe` against our own engine's HTTP endpoint: with the incident's fault injected
(placeholder_on_reject + skip_scrub) and the manifest and writer-tag checks off it finds
the marker of one request in the replies of others, as the ground truth says happened;
with every defence on it finds nothing. Small pools, a window of 512, the copy model."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from engine.adapters.leak_probe import ALPHABET
from engine.config import REPO_ROOT

pytestmark = pytest.mark.e2e  # real engine processes

FAULTS = {"placeholder_on_reject": True, "skip_scrub": True}
SMALL = {"engine": {"context_window": 512, "page_size": 16, "max_batch": 8},
         "pools": {"prefill": {"pages": 64}, "decode": {"pages": 128}}}


def probe(*args: str) -> tuple[int, dict | None, str]:
    proc = subprocess.run([sys.executable, "main.py", "probe", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=900)
    lines = proc.stdout.strip().splitlines()
    report = json.loads(lines[-1]) if "--json" in args and lines and lines[-1].startswith("{") else None
    return proc.returncode, report, proc.stdout + proc.stderr


def test_probe_finds_the_placeholder_leak(start_server):
    server = start_server("--allow-faults", "--http-port", "0", faults=FAULTS,
                          defences={"manifest_check": False, "writer_tag_check": False}, **SMALL)
    code, report, out = probe("--url", server.ready["http"], "--rounds", "2", "--followups", "2", "--json")
    assert code == 1, out
    assert report["leak"] and report["long_tokens"] == 512 - 64 and report["requests"] == 1 + 2 * 3
    # the copy model is good, not perfect (a round may miss): two rounds, and any finding counts
    assert any(r["marker_repeated"] for r in report["rounds"]), out  # a leak shows in its text
    assert report["findings"], out
    for finding in report["findings"]:
        assert len(finding["fragment"]) >= 12 and set(finding["fragment"]) <= set(ALPHABET)
        assert finding["round"] == finding["marker_round"]  # each round's pages: its own marker prompt's
        assert f"LEAK round {finding['round']}, reply {finding['reply']}: '{finding['fragment']}'" in out
    # white-box agreement: the decode worker saw the follow-ups read the marker prompts' pages
    reads = server.client().call("ground_truth")["reads"]
    assert reads and all(r["reader"].startswith("http-") and r["source"].startswith("http-") for r in reads)
    assert any(r["reader"] != r["source"] for r in reads)


def test_probe_finds_nothing_with_the_defences_on(start_server):
    server = start_server("--allow-faults", "--http-port", "0", faults=FAULTS, **SMALL)
    code, report, out = probe("--url", server.ready["http"], "--rounds", "1", "--followups", "2", "--json")
    assert code == 0, out
    assert not report["leak"] and report["findings"] == []
    (round1,) = report["rounds"]
    assert round1["followups"] == ["failed (transfer_mismatch)"] * 2  # I3 stopped both placeholders
    assert server.client().call("ground_truth")["reads"] == []


def test_probe_usage_errors_name_the_value_and_the_limit():
    for args, words in ((["--url", "http://127.0.0.1:9", "--rounds", "0"], "--rounds 0 is outside 1..50"),
                        (["--url", "http://127.0.0.1:9", "--rounds", "51"], "--rounds 51 is outside 1..50"),
                        (["--url", "http://127.0.0.1:9", "--rate", "50"], "--rate 50 must be above 0 and at most 10"),
                        (["--url", "http://10.1.2.3:8000"], "not loopback; pass --allow-remote"),
                        (["--url", "http://127.0.0.1:9", "--api-key-env", "PW_NO_SUCH_VAR"], "PW_NO_SUCH_VAR")):
        code, _, out = probe(*args)
        assert code == 2 and words in out, (args, out)
