"""`probe` against our own engine's HTTP endpoint: with the incident's fault injected
(placeholder_on_reject + skip_scrub) and the manifest and writer-tag checks off it finds
the marker of one request in the replies of others, as the ground truth says happened;
with every defence on it finds nothing; without the fault each strategy gets what a healthy
engine answers. Small pools, a window of 512, the copy model.

The follow-up strategies' request shapes and outcome counts are checked against a fake
OpenAI server that clamps max_tokens as vLLM 0.32 does (no engine needed)."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from engine.adapters.leak_probe import ALPHABET, LeakProbe
from engine.adapters.openai_http import OpenAIHttp
from engine.config import REPO_ROOT

FAULTS = {"placeholder_on_reject": True, "skip_scrub": True}
# the 2026 incident's engine had no prefix cache: with one, finished prompts' pages stay cached
# instead of going back stale to the next reservation, and the placeholder reads nothing of them
SMALL = {"engine": {"context_window": 512, "page_size": 16, "max_batch": 8},
         "pools": {"prefill": {"pages": 64}, "decode": {"pages": 128}}, "prefix_cache": {"scope": "off"}}


def probe(*args: str) -> tuple[int, dict | None, str]:
    proc = subprocess.run([sys.executable, "main.py", "probe", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=900)
    lines = proc.stdout.strip().splitlines()
    report = json.loads(lines[-1]) if "--json" in args and lines and lines[-1].startswith("{") else None
    return proc.returncode, report, proc.stdout + proc.stderr


@pytest.mark.e2e
def test_probe_finds_the_placeholder_leak(start_server):
    server = start_server("--allow-faults", "--http-port", "0", faults=FAULTS,
                          defences={"manifest_check": False, "writer_tag_check": False}, **SMALL)
    code, report, out = probe("--url", server.ready["http"], "--rounds", "2", "--followups", "2", "--json")
    assert code == 1, out
    assert report["leak"] and report["long_tokens"] == 512 - 64 and report["requests"] == 1 + 2 * 3
    assert report["strategy"] == "auto"  # the default: over_window first, then the others in turn
    assert [[d["strategy"] for d in r["details"]] for r in report["rounds"]] == [
        ["over_window", "exact_window"], ["over_window", "prompt_over_window"]]
    assert all(r["details"][0]["status"] == 200 for r in report["rounds"]), out  # the fault admitted it
    assert "follow-up(s) asking past the window were answered (HTTP 200) with no clamp seen" in out
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


@pytest.mark.e2e
def test_probe_finds_nothing_with_the_defences_on(start_server):
    server = start_server("--allow-faults", "--http-port", "0", faults=FAULTS, **SMALL)
    code, report, out = probe("--url", server.ready["http"], "--rounds", "1", "--followups", "4", "--json")
    assert code == 0, out
    assert not report["leak"] and report["findings"] == []
    (round1,) = report["rounds"]
    assert [d["strategy"] for d in round1["details"]] == ["over_window", "exact_window", "prompt_over_window",
                                                          "block_aligned"]
    # I3 stopped both placeholders (the over-window asks); the asks that fit were answered
    assert round1["followups"] == ["failed (transfer_mismatch)", "answered", "failed (transfer_mismatch)",
                                   "answered"], out
    assert server.client().call("ground_truth")["reads"] == []


@pytest.mark.e2e
def test_probe_without_the_fault_gets_what_a_healthy_engine_answers(start_server):
    """Our engine refuses what does not fit the window (HTTP 400) and clamps nothing."""
    server = start_server("--http-port", "0", **SMALL)
    code, report, out = probe("--url", server.ready["http"], "--rounds", "1", "--followups", "4", "--json")
    assert code == 0 and not report["leak"] and report["findings"] == [], out
    none = {"answered": 0, "clamped": 0, "refused": 0, "failed": 0}
    assert report["outcomes"] == {"over_window": {**none, "refused": 1}, "exact_window": {**none, "answered": 1},
                                  "prompt_over_window": {**none, "refused": 1},
                                  "block_aligned": {**none, "answered": 1}}, out
    over, exact, too_long, aligned = report["rounds"][0]["details"]
    assert (over["status"], over["prompt_tokens"], over["max_tokens"]) == (400, 448, 65)
    assert (exact["status"], exact["prompt_tokens"], exact["max_tokens"]) == (200, 448, 64)
    assert too_long["status"] == 400 and 513 <= too_long["prompt_tokens"] <= 512 + 16
    assert aligned["status"] == 200 and aligned["prompt_tokens"] + aligned["max_tokens"] == 512
    assert over["error_code"] == too_long["error_code"] == "admission_rejected"
    assert "over_window: 1 follow-up: 0 answered (HTTP 200), 0 clamped (HTTP 200), 1 refused, 0 failed" in out
    assert "note:" not in out


def test_probe_usage_errors_name_the_value_and_the_limit():
    url = ["--url", "http://127.0.0.1:9"]
    for args, words in ((["--rounds", "0"], "--rounds 0 is outside 1..50"),
                        (["--rounds", "51"], "--rounds 51 is outside 1..50"),
                        (["--rate", "50"], "--rate 50 must be above 0 and at most 10"),
                        (["--block-size", "0"], "--block-size 0 is outside 1..4096"),
                        (["--block-size", "4097"], "--block-size 4097 is outside 1..4096"),
                        (["--strategy", "clamp"], ("--strategy 'clamp' is not one of auto, over_window, "
                                                   "exact_window, prompt_over_window, block_aligned")),
                        (["--strategy", "over_window,nope"], "--strategy 'nope' is not one of auto"),
                        (["--url", "http://10.1.2.3:8000"], "not loopback; pass --allow-remote"),
                        (["--api-key-env", "PW_NO_SUCH_VAR"], "PW_NO_SUCH_VAR")):
        code, _, out = probe(*url, *args)
        assert code == 2 and words in out, (args, out)


# ---- follow-up strategies, against a fake server that clamps max_tokens as vLLM 0.32 does ----
class ClampingServer:
    """A tiny vLLM-like /v1 on 127.0.0.1: byte-level tokens (<s> + one per UTF-8 byte), a
    prompt past the window refused with HTTP 400, max_tokens clamped to the room left and
    answered 200 with finish_reason 'length' (one token, one character, per streamed chunk:
    the start of the prompt, so a marker prompt repeats its marker and nothing leaks). Every
    completion request is recorded: prompt tokens, max_tokens asked and granted, status."""

    def __init__(self, window: int = 512):
        self.window, self.requests = window, []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _json(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._json(200, {"object": "list", "data": [{"id": "fake", "max_model_len": owner.window}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                tokens = 1 + len(body["prompt"].encode())
                asked = body["max_tokens"]
                record = {"prompt_tokens": tokens, "max_tokens": asked, "stream": body.get("stream", False)}
                owner.requests.append(record)
                if tokens > owner.window:
                    record.update(status=400, granted=0)
                    return self._json(400, {"error": {"code": "context_length_exceeded", "type": "BadRequestError",
                                                      "message": f"prompt of {tokens} tokens > {owner.window}"}})
                granted = min(asked, owner.window - tokens)
                record.update(status=200, granted=granted)
                text = (body["prompt"] * 2)[:granted]
                usage = {"prompt_tokens": tokens, "completion_tokens": granted, "total_tokens": tokens + granted}
                if not record["stream"]:
                    return self._json(200, {"choices": [{"index": 0, "text": text, "finish_reason": "length"}],
                                            "usage": usage})
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for n, char in enumerate(text, start=1):
                    choice = {"index": 0, "text": char, "finish_reason": "length" if n == granted else None}
                    self.wfile.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
                if (body.get("stream_options") or {}).get("include_usage"):
                    self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def clamping():
    server = ClampingServer(window=512)
    yield server
    server.close()


def probe_of(server: ClampingServer, **kw) -> LeakProbe:
    options = {"model": "fake", "window": server.window, "long_tokens": 300, "followups": 3, "read_chars": 256,
               "rng": random.Random(11), "block_size": 32, **kw}
    return LeakProbe(OpenAIHttp(server.url, per_second=1000.0, timeout_s=10.0), **options)


def followup_requests(server: ClampingServer) -> list[dict]:
    return [r for r in server.requests if r["stream"]]


def test_each_strategy_sends_the_request_shape_it_promises(clamping):
    probe = probe_of(clamping)  # auto; marker prompt 300 tokens, window 512, block 32
    rounds = [probe.run_round(n) for n in (1, 2, 3)]
    details = [d for r in rounds for d in r.details]
    # auto: over_window leads every round, the other three take turns round after round
    assert [d.strategy for d in details] == ["over_window", "exact_window", "prompt_over_window",
                                             "over_window", "block_aligned", "exact_window",
                                             "over_window", "prompt_over_window", "block_aligned"]
    sent = followup_requests(clamping)
    assert len(sent) == 9 and [r["prompt_tokens"] for r in clamping.requests if not r["stream"]] == [300] * 3
    aligned = []
    for detail, request in zip(details, sent, strict=True):
        tokens, max_tokens = request["prompt_tokens"], request["max_tokens"]
        assert (detail.prompt_tokens, detail.max_tokens) == (tokens, max_tokens), detail  # planned = sent, exactly
        if detail.strategy == "over_window":
            assert (tokens, max_tokens) == (300, 213)  # one past the window
        elif detail.strategy == "exact_window":
            assert (tokens, max_tokens) == (300, 212)  # the window to its last slot
        elif detail.strategy == "prompt_over_window":
            assert 513 <= tokens <= 512 + 32 and max_tokens == 48
        else:
            assert tokens % 32 == 0 and tokens + max_tokens == 512
            aligned.append(tokens)
    assert aligned == [288, 320]  # 300 rounded down, then up, to the block


def test_one_strategy_or_a_list_is_used_as_named(clamping):
    probe = probe_of(clamping, strategy="block_aligned", followups=4, block_size=16)
    probe.run_round(1)
    assert [(r["prompt_tokens"], r["max_tokens"]) for r in followup_requests(clamping)] == [
        (288, 224), (304, 208), (288, 224), (304, 208)]
    clamping.requests.clear()
    probe = probe_of(clamping, strategy="exact_window,prompt_over_window", followups=3, block_size=1)
    report = probe.run_round(1)
    assert [d.strategy for d in report.details] == ["exact_window", "prompt_over_window", "prompt_over_window"]
    assert [(r["prompt_tokens"], r["max_tokens"]) for r in followup_requests(clamping)] == [
        (300, 212), (513, 48), (513, 48)]


def test_a_clamping_server_shows_no_leak_and_its_outcomes_are_counted_per_strategy(clamping):
    code, report, out = probe("--url", clamping.url, "--rounds", "2", "--followups", "3", "--long-tokens", "300",
                              "--block-size", "32", "--rate", "10", "--json")
    assert code == 0, out
    assert not report["leak"] and report["findings"] == [] and report["requests"] == 1 + 2 * 4
    assert (report["strategy"], report["block_size"]) == ("auto", 32)
    none = {"answered": 0, "clamped": 0, "refused": 0, "failed": 0}
    assert report["outcomes"] == {"over_window": {**none, "clamped": 2}, "exact_window": {**none, "answered": 2},
                                  "prompt_over_window": {**none, "refused": 1},
                                  "block_aligned": {**none, "answered": 1}}
    assert "over_window: 2 follow-ups: 0 answered (HTTP 200), 2 clamped (HTTP 200), 0 refused, 0 failed" in out
    assert "prompt_over_window: 1 follow-up: 0 answered (HTTP 200), 0 clamped (HTTP 200), 1 refused" in out
    assert "note:" not in out  # every ask past the window was clamped or refused
    round1 = report["rounds"][0]
    assert round1["followups"] == ["clamped (212 of 213 tokens)", "answered",
                                   "refused (HTTP 400 context_length_exceeded)"]
    over, exact, too_long = round1["details"]
    assert (over["status"], over["finish_reason"], over["completion_tokens"], over["server_prompt_tokens"]) == \
        (200, "length", 212, 300)
    assert (exact["status"], exact["outcome"], exact["completion_tokens"]) == (200, "answered", 212)
    assert (too_long["status"], too_long["outcome"], too_long["finish_reason"]) == (400, "refused", None)
    # the server did clamp: every over_window ask of 213 got the 212 tokens left
    assert [r["granted"] for r in followup_requests(clamping) if r["max_tokens"] == 213] == [212, 212]


def test_bad_strategy_or_block_size_is_refused_by_the_probe_itself():
    for kw, words in (({"strategy": "nope"}, "strategy 'nope' is not one of auto, over_window, exact_window"),
                      ({"strategy": "auto,over_window"}, "auto mixes every strategy and cannot be listed with others"),
                      ({"strategy": ""}, "strategy '' is not one of auto"),
                      ({"strategy": "over_window,over_window"}, "names a strategy twice"),
                      ({"block_size": 0}, "block size 0 is outside 1..4096"),
                      ({"block_size": 4097}, "block size 4097 is outside 1..4096"),
                      ({"block_size": 300}, "block size 300 is too large for the context window 512")):
        with pytest.raises(ValueError, match=re.escape(words)):
            LeakProbe(None, model="m", window=512, long_tokens=448, followups=2, read_chars=64, **kw)
    # a block larger than half the window is fine when block_aligned is not asked for
    assert LeakProbe(None, model="m", window=512, long_tokens=448, followups=2, read_chars=64,
                     strategy="prompt_over_window", block_size=300).block_size == 300


def test_probe_cli_names_a_bad_block_size_for_the_served_window(clamping):
    code, _, out = probe("--url", clamping.url, "--block-size", "300", "--rounds", "1")
    assert code == 2 and "block size 300 is too large for the context window 512" in out, out
    assert "at most 256" in out and clamping.requests == []  # nothing sent but the model list
