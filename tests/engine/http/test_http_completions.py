"""The OpenAI-compatible HTTP endpoint of a real `serve --http-port 0`: whole and streamed
completions agree, /v1/models, bad input is a 400 naming the field, the engine's own
rejections are a 400 with its message, and the supervisor keeps serving."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from engine.client.local_server import LocalServer as ServerProcess
from engine.client.local_server import write_config
from engine.config import REPO_ROOT
from engine.guard.canaries import PROMPT_FORM

pytestmark = pytest.mark.e2e  # real engine processes


WINDOW = 512
MARKERS = ("q7lx2m9vd0ka4tz83nbwe1ry", "z0p3k8w1c5h2m7q4t9x6v0b3n8", "h6d1s9f2j4k7l0p3r5t8w2y4e6",
           "m5n8b2v4c7x1z3a6s9d0f2g4h")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    config = write_config(tmp_path_factory.mktemp("http") / "config.toml", engine={"context_window": WINDOW},
                          pools={"prefill": {"pages": 64}, "decode": {"pages": 128}})
    server = ServerProcess(config, "--http-port", "0")
    server.wait_workers(server.client())
    yield server
    server.stop()


def post(server, body: dict | bytes, path: str = "/v1/completions") -> tuple[int, object]:
    """(status, parsed JSON body) — or the raw SSE text of a stream."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(server.ready["http"] + path, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=180) as response:
            raw = response.read().decode()
            if response.headers.get("Content-Type", "").startswith("text/event-stream"):
                return response.status, raw
            return response.status, json.loads(raw)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def sse_chunks(raw: str) -> list:
    events = [line[len("data: "):] for line in raw.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]", raw[-200:]
    return [json.loads(e) for e in events[:-1]]


def test_models_lists_the_served_model_and_window(server):
    with urllib.request.urlopen(server.ready["http"] + "/v1/models", timeout=60) as response:
        body = json.loads(response.read())
    (model,) = body["data"]
    assert body["object"] == "list" and model["object"] == "model"
    assert model["id"] == "pagewarden-copy" and model["max_model_len"] == WINDOW


def test_streamed_text_equals_whole_text(server):
    prompt = PROMPT_FORM.format(text=f"{MARKERS[0]} river stone")
    body = {"model": "pagewarden-copy", "prompt": prompt, "max_tokens": 40, "temperature": 0}
    status, whole = post(server, body)
    assert status == 200, whole
    (choice,) = whole["choices"]
    assert MARKERS[0] in choice["text"]  # the copy model repeats its context
    assert choice["finish_reason"] in ("stop", "length") and whole["object"] == "text_completion"
    assert whole["usage"]["prompt_tokens"] == 1 + len(prompt.encode())  # <s> + bytes
    status, raw = post(server, {**body, "stream": True, "stream_options": {"include_usage": True}})
    assert status == 200
    chunks = sse_chunks(raw)
    streamed = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert streamed == choice["text"]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == choice["finish_reason"]
    details = chunks[-1]["usage"].pop("prompt_tokens_details")
    assert chunks[-1]["usage"] == {k: v for k, v in whole["usage"].items() if k != "prompt_tokens_details"}
    assert whole["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert details["cached_tokens"] > 0  # the same prompt again, the same tenant: its full pages were cached
    # a list of token ids is the same prompt
    status, by_ids = post(server, {**body, "prompt": [256, *prompt.encode()]})
    assert status == 200 and by_ids["choices"][0]["text"] == choice["text"]


def test_cache_salt_decides_who_shares_cached_prompt_pages_and_usage_says_how_many(server):
    """vLLM's API: the same salt hits, another salt misses; prompt_tokens_details.cached_tokens."""
    text = "a long shared preamble, the same for every request of this test " * 3
    def cached(salt: str, user: str, stream: bool = False) -> int:
        body = {"prompt": PROMPT_FORM.format(text=text), "max_tokens": 2, "temperature": 0, "user": user,
                "cache_salt": salt}
        if stream:
            status, raw = post(server, {**body, "stream": True, "stream_options": {"include_usage": True}})
            usage = sse_chunks(raw)[-1]["usage"]
        else:
            status, answer = post(server, body)
            usage = answer["usage"]
        assert status == 200
        return usage["prompt_tokens_details"]["cached_tokens"]
    assert cached("salt-a", "acme") == 0
    hit = cached("salt-a", "globex", stream=True)  # the salt, not the tenant, decides when one is given
    assert hit >= 128 and hit % 16 == 0
    assert cached("salt-b", "acme") == 0


def test_stop_sequence_ends_the_text_before_it(server):
    body = {"prompt": PROMPT_FORM.format(text=MARKERS[1]), "max_tokens": 40, "temperature": 0,
            "stop": [MARKERS[1][6:10]]}
    status, whole = post(server, body)
    assert status == 200, whole
    assert whole["choices"][0] == {"index": 0, "text": MARKERS[1][:6], "logprobs": None, "finish_reason": "stop"}
    status, raw = post(server, {**body, "stream": True})
    assert "".join(c["choices"][0]["text"] for c in sse_chunks(raw)) == MARKERS[1][:6]


def test_concurrent_requests_each_get_their_own_answer(server):
    bodies = [{"prompt": PROMPT_FORM.format(text=m), "max_tokens": 32, "temperature": 0, "user": f"tenant-{i}",
               "stream": i % 2 == 1} for i, m in enumerate(MARKERS)]
    with ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(lambda b: post(server, b), bodies))
    for marker, (status, answer) in zip(MARKERS, answers):
        assert status == 200
        text = answer["choices"][0]["text"] if isinstance(answer, dict) else \
            "".join(c["choices"][0]["text"] for c in sse_chunks(answer))
        assert marker in text and not any(m in text for m in MARKERS if m != marker)


@pytest.mark.parametrize("body, param, words", [
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens", ["0", "from 1 to 2,097,152"]),
    ({"prompt": "hi", "temperature": 3.5}, "temperature", ["3.5", "from 0 to 2"]),
    ({"prompt": "hi", "top_p": 0}, "top_p", ["0", "above 0 and at most 1"]),
    ({"max_tokens": 4}, "prompt", ["required"]),
    ({"prompt": 42}, "prompt", ["42", "string or a non-empty list"]),
    ({"prompt": ["a", "b"]}, "prompt", ["batch of 2"]),
    ({"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, "stop", ["at most 4"]),
    ({"prompt": "hi", "user": "u" * 65}, "user", ["1 to 64 characters"]),
    ({"prompt": "hi", "stream": "yes"}, "stream", ["'yes'", "true or false"]),
    ({"prompt": "hi", "n": 2}, "n", ["2", "not supported", "only 1 is served"]),
    ({"prompt": "hi", "n": True}, "n", ["True", "only 1 is served"]),  # was accepted: True == 1
    ({"prompt": "hi", "echo": 0}, "echo", ["0", "only false"]),  # was accepted: 0 == False
    ({"prompt": "hi", "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools",
     ["does not call tools"]),
    ({"prompt": "hi", "max_token": 5}, "max_token", ["unknown field 'max_token'", "max_tokens"]),
    ({"prompt": "hi", "logprobs": 1}, "logprobs", ["not returned"]),
    ({"prompt": "hi", "cache_salt": ""}, "cache_salt", ["1 to 256 characters", "salt"]),
    ({"prompt": "hi", "cache_salt": 7}, "cache_salt", ["7", "1 to 256 characters"]),
])
def test_bad_input_is_400_naming_the_field(server, body, param, words):
    status, answer = post(server, body)
    assert status == 400, answer
    error = answer["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert all(w in error["message"] for w in words), error["message"]


def test_engine_rejections_are_400_with_the_engine_message(server):
    for stream in (False, True):  # a rejected stream is refused before it starts
        status, answer = post(server, {"prompt": "hi", "max_tokens": 1000, "stream": stream})
        assert status == 400 and answer["error"]["code"] == "admission_rejected"
        message = answer["error"]["message"]
        assert "1,003 tokens" in message and f"context window is {WINDOW}" in message
    status, answer = post(server, {"prompt": [256, 99999]})
    assert status == 400 and answer["error"]["code"] == "invalid_request"
    assert "99999 is outside the vocabulary" in answer["error"]["message"]
    status, answer = post(server, {"prompt": "hi", "model": "gpt-9"})
    assert status == 404 and answer["error"]["param"] == "model" and "'gpt-9'" in answer["error"]["message"]


def test_supervisor_keeps_serving_after_bad_input(server):
    for raw in (b"{not json", b"[1, 2]", b'{"prompt": "\\ud800"}', b"\xff\xfe"):
        status, answer = post(server, raw)
        assert status == 400, (raw, answer)
    status, answer = post(server, {"prompt": PROMPT_FORM.format(text=MARKERS[2]), "max_tokens": 32, "temperature": 0})
    assert status == 200 and MARKERS[2] in answer["choices"][0]["text"]
    assert server.client().ping()["pong"] > 0
    server.check_alive()


def test_a_client_that_hangs_up_cancels_its_request(server):
    client = server.client()
    before = client.status()["counters"].get("cancelled", 0)
    body = {"prompt": "hi", "max_tokens": 400, "ignore_eos": True, "stream": True}
    request = urllib.request.Request(server.ready["http"] + "/v1/completions", json.dumps(body).encode())
    with urllib.request.urlopen(request, timeout=180) as response:
        assert response.readline().startswith(b"data: ")  # streaming has begun; now hang up
    deadline = time.monotonic() + 120
    while client.status()["counters"].get("cancelled", 0) == before:
        assert time.monotonic() < deadline, "the engine request went on after its client left"
        time.sleep(0.2)


def test_non_loopback_http_host_is_refused(tmp_path):
    config = write_config(tmp_path / "config.toml")
    proc = subprocess.run([sys.executable, "main.py", "serve", "--config", str(config), "--bind", "tcp://127.0.0.1:0",
                           "--http-port", "0", "--http-host", "0.0.0.0"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "--http-host 0.0.0.0" in proc.stderr and "no CURVE" in proc.stderr and "--http-allow-remote" in proc.stderr


@pytest.mark.parametrize("raw, words", [
    (b"[" * 100_000 + b"]" * 100_000, "nests arrays or objects too deeply"),
    (b'{"prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}", "a number that cannot be read"),
])
def test_hostile_json_is_400_naming_the_problem(server, raw, words):
    """Issue 14, item 11: these were 500 (RecursionError; int conversion past 4,300 digits)."""
    status, answer = post(server, raw)
    assert status == 400 and words in answer["error"]["message"], answer
    server.check_alive()


def test_connections_that_trickle_their_headers_are_closed(tmp_path):
    """Issue 14, item 11: slow-header connections were never timed out (300 stayed open)."""
    import socket
    import urllib.parse

    from engine.http.completions import HEADER_TIMEOUT_S

    config = write_config(tmp_path / "config.toml")
    server = ServerProcess(config, "--http-port", "0")
    try:
        url = urllib.parse.urlparse(server.ready["http"])
        conns = [socket.create_connection((url.hostname, url.port), timeout=10) for _ in range(20)]
        for conn in conns:
            conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # and never the rest
        for conn in conns:
            conn.settimeout(HEADER_TIMEOUT_S + 120)  # closed by the server after its header timeout
            assert conn.recv(1) == b""
            conn.close()
    finally:
        server.stop()
