"""The salt check (`probe --salt-check`, engine/adapters/salt_check.py) against a fake
OpenAI server with a prefix cache (tests/engine/adapters/fake_cache_server.py, a real
loopback socket): a cache that isolates salts, one that shares them, none at all, and one
that does not report cached_tokens each get their verdict; the ablation that drops the
salt is seen shared; answers past the client's limits are refused naming the limit; and
the CLI end to end (exit status, JSON)."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys

import pytest

from engine.adapters.openai_http import MAX_LINE_BYTES, OpenAIHttp, ProbeError, stream_limit
from engine.adapters.salt_check import (HOLDS, INCONCLUSIVE, NO_CACHE, SHARED, SaltPair, judge,
                                        open_salt_check)
from engine.config import REPO_ROOT
from tests.engine.adapters.fake_cache_server import FakeCacheServer

FAST = {"pairs": 6, "prefix_tokens": 600, "rate": 10.0, "timeout_s": 30.0}


def run_check(mode: str, **options):
    with FakeCacheServer(mode) as server:
        check = open_salt_check(server.url, **{**FAST, **options})
        return check.run(), server


@pytest.mark.parametrize("mode, verdict", [("isolate", HOLDS), ("share", SHARED), ("none", NO_CACHE)])
def test_each_cache_gets_its_verdict_by_counts_and_timing(mode, verdict):
    report, server = run_check(mode)
    assert report.verdict == verdict, report.lines()
    assert report.counts_reported and report.cold_hits == 0
    same, different = report.same_hits, report.different_hits
    assert (same, different) == {"isolate": (6, 0), "share": (6, 6), "none": (0, 0)}[mode]
    timing = {t.name: t for t in report.timing}
    assert timing["same"].resolvable and timing["same"].n == 6 and timing["same"].m == 12
    assert timing["same"].faster == (mode != "none"), report.lines()
    assert timing["different"].faster == (mode == "share"), report.lines()
    if mode != "none":  # the fake's hits skip nearly all of a 600-token prefill
        assert timing["same"].median_ratio < 0.8 and timing["same"].p_value < 0.01
    # 1 model list + 1 warm-up + 2 per pair, 6 pairs of each kind; each pair its own salts
    assert report.requests == 2 + 4 * 6 and len(server.bodies) == 1 + 4 * 6
    salts = [b["cache_salt"] for b in server.bodies]
    assert len(set(salts)) == 1 + 6 + 2 * 6
    assert all(b["max_tokens"] == 1 and b["stream"] and b["stream_options"] == {"include_usage": True}
               for b in server.bodies)
    assert report.prefix_tokens == 600 and all(p.prompt_tokens >= 600 for p in report.pairs)
    if mode == "none":
        assert any("cannot tell salt isolation from no prefix caching" in r for r in report.reasons)
    if mode == "share":
        assert any("crosses tenants" in r for r in report.reasons)


def test_a_server_that_does_not_report_cached_tokens_is_judged_by_timing_and_says_so():
    report, _ = run_check("unreported")
    assert not report.counts_reported and report.verdict == HOLDS, report.lines()
    assert any("does not report usage.prompt_tokens_details.cached_tokens" in r for r in report.reasons)
    assert "judged by timing alone" in "\n".join(report.lines())


def test_too_few_pairs_for_timing_alone_is_inconclusive():
    report, _ = run_check("unreported", pairs=2)
    assert report.verdict == INCONCLUSIVE
    assert any(r.startswith("N too small to tell: the smallest attainable p-value is 0.133") for r in report.reasons)


def test_dropping_the_salt_shows_the_cache_shared():
    report, server = run_check("isolate", no_salt=True)
    assert report.verdict == SHARED and report.different_hits == 6 and report.same_hits == 6, report.lines()
    different = [p for p in report.pairs if p.kind == "different"]
    assert all(p.salt_a is None and p.salt_b is None for p in different)
    assert sum("cache_salt" not in b for b in server.bodies) == 2 * 6


def pair(kind, cold, second, cold_cached=0, second_cached=0, number=1):
    return SaltPair(number, kind, "a", "b", 100, cold, second, cold_cached, second_cached)


def test_judging_counts_against_timing():
    rng = random.Random(3)
    cold = [0.05 + rng.random() * 0.01 for _ in range(16)]
    hit = [0.005 + rng.random() * 0.001 for _ in range(8)]
    # counts say no reuse across salts, timing says the different-salt seconds were fast: inconclusive
    pairs = [pair("same", cold[k], hit[k], 0, 96) for k in range(8)]
    pairs += [pair("different", cold[8 + k], hit[k] * 1.1, 0, 0) for k in range(8)]
    verdict, reasons, facts = judge(pairs)
    assert verdict == INCONCLUSIVE and "timing disagrees with the counts" in reasons[0]
    # a cold request that reports cached tokens: the counts cannot judge
    pairs = [pair("same", cold[k], hit[k], 32, 96) for k in range(8)]
    pairs += [pair("different", cold[8 + k], cold[k], 0, 0) for k in range(8)]
    assert judge(pairs)[0] == INCONCLUSIVE
    # the same salt hits rarely: inconclusive
    pairs = [pair("same", cold[k], cold[8 + k], 0, 96 if k == 0 else 0) for k in range(8)]
    pairs += [pair("different", cold[8 + k], cold[k], 0, 0) for k in range(8)]
    verdict, reasons, _ = judge(pairs)
    assert verdict == INCONCLUSIVE and "hit only 1 of 8" in reasons[0]
    # counts that hold with timing that cannot show it: holds, said
    pairs = [pair("same", cold[k], cold[8 + k], 0, 96) for k in range(8)]
    pairs += [pair("different", cold[8 + k], cold[k], 0, 0) for k in range(8)]
    verdict, reasons, _ = judge(pairs)
    assert verdict == HOLDS and "timing does not show the same-salt hits" in reasons[-1]
    # a server that leaves zero counts out: the missing ones are taken as none cached, and said
    pairs = [pair("same", cold[k], hit[k], None, 96) for k in range(8)]
    pairs += [pair("different", cold[8 + k], cold[k], None, None) for k in range(8)]
    verdict, reasons, facts = judge(pairs)
    assert verdict == HOLDS and facts["counts_reported"] and "came with 8 of 32 requests" in reasons[0]
    # different-salt seconds a little faster than cold (as vLLM's CPU build showed, 0.88): not a hit
    pairs = [pair("same", cold[k], hit[k], 0, 96) for k in range(8)]
    pairs += [pair("different", cold[8 + k], 0.044 + rng.random() * 0.001, 0, 0) for k in range(8)]
    verdict, reasons, facts = judge(pairs)
    different = next(t for t in facts["timing"] if t.name == "different")
    assert different.p_value < 0.05 and 0.8 < different.median_ratio < 1 and not different.faster
    assert verdict == HOLDS and "by less than a hit saves" in reasons[0], reasons


@pytest.mark.parametrize("hostile, words", [
    ("long_line", f"a stream line of over {MAX_LINE_BYTES:,} bytes (the limit)"),
    ("bad_count", "usage cached_tokens '-5' is not a count (0..10,000,000)"),
])
def test_answers_past_the_limits_are_refused_naming_the_limit(hostile, words):
    with FakeCacheServer("isolate", hostile=hostile) as server:
        check = open_salt_check(server.url, **FAST)
        with pytest.raises(ProbeError, match="completions: " + words.replace("(", r"\(").replace(")", r"\)")
                           .replace(".", r"\.")):
            check.run()


@pytest.mark.parametrize("hostile, words", [
    ("long_line", f"a stream line of over {MAX_LINE_BYTES:,} bytes (the limit)"),
    ("endless", f"a stream of over {stream_limit(64):,} bytes (the limit) for 64 characters"),
])
def test_the_leak_probes_stream_meets_the_same_limits(hostile, words):
    """OpenAIHttp.stream (the leak probe's follow-ups) reads through the same bounded reader as
    the timed stream: one endless line, or text-less chunks without end, is refused."""
    with FakeCacheServer("isolate", hostile=hostile) as server:
        http = OpenAIHttp(server.url, per_second=100.0)
        with pytest.raises(ProbeError, match=re.escape("completions: " + words)):
            http.stream({"model": "fake-copy", "prompt": "hello", "max_tokens": 4}, 64)


def salt_cli(*args: str) -> tuple[int, dict | None, str]:
    proc = subprocess.run([sys.executable, "main.py", "probe", "--salt-check", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)
    lines = proc.stdout.strip().splitlines()
    report = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None
    return proc.returncode, report, proc.stdout + proc.stderr


def test_the_cli_end_to_end():
    args = ("--pairs", "5", "--prefix-tokens", "500", "--rate", "10", "--json")
    with FakeCacheServer("isolate") as server:
        code, report, out = salt_cli("--url", server.url, *args)
        assert code == 0, out
        assert report["verdict"] == HOLDS and report["mode"] == "salt_check" and report["model"] == "fake-copy"
        assert report["same_hits"] == 5 and report["different_hits"] == 0 and len(report["pairs"]) == 10
        assert {t["name"] for t in report["timing"]} == {"same", "different"}
        assert all(0 <= t["p_value"] <= 1 and 0 <= t["d"] <= 1 for t in report["timing"])
        assert f"salt check {server.url} model fake-copy: salt isolation holds" in out
        code, report, out = salt_cli("--url", server.url, "--no-salt", *args)
        assert code == 1 and report["verdict"] == SHARED and report["no_salt"], out
    with FakeCacheServer("none") as server:
        code, report, out = salt_cli("--url", server.url, *args)
        assert code == 3 and report["verdict"] == NO_CACHE, out
    code, report, out = salt_cli("--url", "http://127.0.0.1:9", "--pairs", "1", "--json")
    assert code == 2 and report["error"]["message"] == "--pairs 1 is outside 2..64", out


@pytest.mark.e2e
@pytest.mark.parametrize("scope, no_salt, verdict", [("tenant", False, HOLDS), ("off", False, NO_CACHE),
                                                     ("global", True, SHARED)])
def test_the_check_against_our_own_served_engine(start_server, scope, no_salt, verdict):
    """PageWarden's server takes cache_salt and reports prompt_tokens_details.cached_tokens:
    salted, it holds; with no cache it says it cannot tell; unsalted under the global scope
    (the ablation sends no salt in the different-salt pairs) it is shared."""
    server = start_server("--http-port", "0", engine={"context_window": 2048, "page_size": 16},
                          pools={"prefill": {"pages": 256}, "decode": {"pages": 512}},
                          prefix_cache={"scope": scope})
    check = open_salt_check(server.ready["http"], pairs=4, prefix_tokens=600, rate=20.0, timeout_s=120.0,
                            no_salt=no_salt)
    report = check.run()
    assert report.counts_reported, report.lines()
    assert report.verdict == verdict, report.lines()
    if verdict == HOLDS:
        assert report.same_hits == 4 and report.different_hits == 0
