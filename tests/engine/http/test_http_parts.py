"""The HTTP frontend's and the probe's pure parts: request checks, stop sequences over
streamed text, the loopback rule, probe prompts of exact length, marker fragments."""

from __future__ import annotations

import random

import pytest

from engine.adapters.leak_probe import LeakProbe, filler, leaked_fragment, new_marker
from engine.guard.canaries import PROMPT_FORM
from engine.http.openai_request import HttpError, parse_completion
from engine.http.stop_filter import StopFilter
from engine.wire.sockets import is_loopback_host as is_loopback


def test_parse_completion_maps_openai_fields_to_submit_fields():
    req = parse_completion({"model": "m", "prompt": "hi", "max_tokens": 7, "temperature": 0, "top_p": 0.5,
                            "stop": "\n", "user": "acme", "seed": 3, "n": 1, "logprobs": None})
    assert req.stop == ("\n",)
    assert req.submit_fields() == {"max_new_tokens": 7, "temperature": 0.0, "top_p": 0.5, "ignore_eos": False,
                                   "stream": True, "tenant": "acme", "seed": 3, "prompt": "hi"}
    assert parse_completion({"prompt": [[256, 72]]}).prompt_ids == [256, 72]  # a batch of one


@pytest.mark.parametrize("body, streams", [({}, False), ({"stop": "x"}, True), ({"stream": True}, True),
                                           ({"stream": True, "stop": ["a", "b"]}, True)])
def test_only_a_streamed_or_stopped_completion_asks_the_engine_for_each_token(body, streams):
    """A whole answer without stop strings needs only `done`: no message per token."""
    assert parse_completion({"prompt": "hi", **body}).submit_fields()["stream"] is streams


def test_parse_completion_errors_name_field_value_and_limit():
    with pytest.raises(HttpError) as err:
        parse_completion({"prompt": "hi", "max_tokens": 1 << 30})
    assert err.value.status == 400 and err.value.param == "max_tokens"
    assert "1073741824" in str(err.value) and "2,097,152" in str(err.value)
    with pytest.raises(HttpError, match="lone surrogate") as err:
        parse_completion({"prompt": "a\ud800"})
    assert err.value.param == "prompt"
    with pytest.raises(HttpError, match="True is invalid"):
        parse_completion({"prompt": "hi", "max_tokens": True})


@pytest.mark.parametrize("pieces", [["ab", "cSTO", "Pxyz"], ["abcST", "OP"], ["abc", "STOP"], ["abcSTOP!"]])
def test_stop_filter_never_lets_a_stop_sequence_through(pieces):
    stops = StopFilter(("STOP",))
    sent = "".join(stops.feed(p) for p in pieces) + stops.flush()
    assert sent == "abc" and stops.stopped


def test_stop_filter_releases_a_false_start_at_the_end():
    stops = StopFilter(("STOP", "\n\n"))
    assert stops.feed("abST") == "ab" and stops.feed("x\n") == "STx" and stops.flush() == "\n"
    assert not stops.stopped


def test_loopback_rule():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("[::1]") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.5") and not is_loopback("gpu-box")


def test_probe_prompts_have_exact_lengths():
    rng = random.Random(5)
    probe = LeakProbe(None, model="m", window=512, long_tokens=448, followups=2, read_chars=64, rng=rng)
    marker = new_marker(rng)
    prompt = probe.marker_prompt(marker)
    assert 1 + len(prompt.encode()) == 448 and prompt.startswith(marker) and prompt.endswith(PROMPT_FORM[-10:])
    followup = probe.followup_prompt(len(prompt))
    assert len(followup) == len(prompt) and marker not in followup
    assert len(filler(rng, 37, lead="x")) == 37


def test_leaked_fragment_needs_twelve_characters():
    marker = "q7lx2m9vd0ka4tz83nbwe1ry"
    assert leaked_fragment(marker, "noise " + marker[3:15] + " noise") == marker[3:15]
    assert leaked_fragment(marker, "noise " + marker[3:14] + " noise") is None
    assert leaked_fragment(marker, "\n" + marker + " river") == marker


def test_connections_past_the_cap_get_503_and_are_closed():
    """Issue 14, item 11: there was no connection cap (300 slow connections stayed open)."""
    import socket
    import time

    from engine.http.frontend import HttpFrontend

    frontend = HttpFrontend("tcp://127.0.0.1:9", max_connections=3)  # no engine needed to connect
    url = frontend.start()
    host, port = url.rsplit("/", 1)[-1].rsplit(":", 1)
    held = []
    try:
        for _ in range(3):
            held.append(socket.create_connection((host, int(port)), timeout=30))
        for _ in range(500):  # until the server holds them (accepted on its own thread)
            if len(frontend.capped.server.connections) == 3:
                break
            time.sleep(0.02)
        extra = socket.create_connection((host, int(port)), timeout=30)
        answer = extra.recv(4096)
        assert answer.startswith(b"HTTP/1.1 503") and b"too_many_connections" in answer
        assert extra.recv(1) == b""  # closed
        extra.close()
        assert frontend.capped.refused == 1
        held.pop().close()
        for _ in range(500):
            if len(frontend.capped.server.connections) < 3:
                break
            time.sleep(0.02)
        again = socket.create_connection((host, int(port)), timeout=30)
        again.sendall(b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n")
        assert again.recv(4096).startswith(b"HTTP/1.1 404")  # a free place is served again
        again.close()
    finally:
        for sock in held:
            sock.close()
        frontend.stop()


@pytest.mark.parametrize("value, ok", [("2", True), ("3600", True), ("0", False), ("-1", False), ("nan", False),
                                       ("3601", False)])
def test_chat_render_cpu_flag_is_checked(value, ok):
    import argparse

    from engine.http.options import add_http_args, check_http_args

    parser = argparse.ArgumentParser()
    add_http_args(parser)
    args = parser.parse_args(["--http-port", "0", "--chat-render-cpu-s", value])
    if ok:
        check_http_args(args)
    else:
        with pytest.raises(ValueError, match=f"--chat-render-cpu-s {float(value):g} is outside"):
            check_http_args(args)


def test_unknown_fields_are_named_and_neutral_ones_need_their_type():
    with pytest.raises(HttpError, match=r"unknown fields 'a0', 'a1', 'a2', 'a3', 'a4' and 5 more") as err:
        parse_completion({"prompt": "hi", **{f"a{i}": i for i in range(10)}})
    assert err.value.param == "a0" and err.value.code == "unknown_parameter"
    req = parse_completion({"prompt": "hi", "n": 1, "best_of": 1, "echo": False, "presence_penalty": 0.0,
                            "frequency_penalty": 0, "logit_bias": {}, "suffix": None, "tools": None,
                            "return_token_ids": True})  # vLLM's, as bench/vs_vllm.py sends it
    assert req.prompt == "hi"
    for body in ({"n": 1.0}, {"echo": 0}, {"logit_bias": {"50256": -100}}, {"presence_penalty": False}):
        with pytest.raises(HttpError, match="not supported by this engine"):
            parse_completion({"prompt": "hi", **body})


def test_one_source_cannot_take_every_connection_another_source_still_gets_in():
    """256 idle sockets from one address locked every other user out (503) for as long as they
    stayed; now one address holds at most max_per_source. Two loopback sources: 127.0.0.1 and
    127.0.0.2 (the whole 127/8 is loopback on Linux)."""
    import socket
    import time

    from engine.http.frontend import HttpFrontend

    frontend = HttpFrontend("tcp://127.0.0.1:9", max_connections=6, max_per_source=3)
    url = frontend.start()
    port = int(url.rsplit(":", 1)[-1])
    held = []
    try:
        for _ in range(3):  # the greedy source takes its share
            held.append(socket.create_connection(("127.0.0.1", port), timeout=30, source_address=("127.0.0.1", 0)))
        for _ in range(500):
            if len(frontend.capped.server.connections) == 3:
                break
            time.sleep(0.02)
        extra = socket.create_connection(("127.0.0.1", port), timeout=30, source_address=("127.0.0.1", 0))
        answer = extra.recv(4096)
        assert answer.startswith(b"HTTP/1.1 503") and b"from 127.0.0.1 (3, the most one address may hold)" in answer
        assert extra.recv(1) == b""
        extra.close()
        assert frontend.capped.refused_per_source == 1 and frontend.capped.refused == 0
        # another source is served: its request reaches aiohttp (a 404 for an unknown path)
        other = socket.create_connection(("127.0.0.1", port), timeout=30, source_address=("127.0.0.2", 0))
        other.sendall(b"GET /nowhere HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert other.recv(4096).startswith(b"HTTP/1.1 404")
        other.close()
        # a closed connection gives its source's place back
        held.pop().close()
        for _ in range(500):
            if frontend.capped.open_by_source.get("127.0.0.1", 0) < 3:
                break
            time.sleep(0.02)
        again = socket.create_connection(("127.0.0.1", port), timeout=30, source_address=("127.0.0.1", 0))
        again.sendall(b"GET /nowhere HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert again.recv(4096).startswith(b"HTTP/1.1 404")
        again.close()
    finally:
        for s in held:
            s.close()
        frontend.stop()


def test_a_burst_that_finds_the_model_info_stale_makes_one_status_call():
    """64 requests arriving just after the cached model info expired each asked the engine for
    its status; they now share one call, and all get its answer."""
    import asyncio

    from engine.http.completions import CompletionsApp

    class Link:  # the one EngineLink call model_info makes, counted
        calls = 0

        async def call(self, op, **fields):
            Link.calls += 1
            await asyncio.sleep(0.01)  # in flight while the rest of the burst arrives
            return {"engine": {"model": "/models/copy", "uptime_s": 5.0},
                    "config": {"engine": {"context_window": 2048}}}

    async def burst():
        app = CompletionsApp(Link())
        try:
            return await asyncio.gather(*(app.model_info() for _ in range(64)))
        finally:
            await app.renderer.close()

    infos = asyncio.run(burst())
    assert Link.calls == 1
    assert {i["id"] for i in infos} == {"copy"} and infos[0]["max_model_len"] == 2048
