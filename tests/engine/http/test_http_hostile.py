"""Hostile chat templates and prompts on a real `serve --http-port 0`: every limit is a 400
naming it, and everyone else is served meanwhile (checked by order: their answers arrive
while the hostile render is still running, never by how long anything took).

Before: the template was rendered on the HTTP thread and recompiled per request. Two nested
range(100000) loops froze every HTTP route and grew the supervisor ~100 MB/s until the OOM
killer took it (18.6 GB); serve ignored SIGTERM for 20 s; `'x' * 300000000` in a branch never
taken cost 6-8 s and 1.1 GB a request; recursion and a huge range were 500s. A 4 MiB text
prompt was tokenized on the supervisor's loop before admission rejected it."""

from __future__ import annotations

import json
import select
import shutil
import signal
import socket
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from engine.client.local_server import LocalServer as ServerProcess
from engine.client.local_server import write_config
from engine.config import DEFAULT_MODEL_DIR
from engine.server.prompt_text import MAX_BYTES_PER_TOKEN
from tests.engine.http.test_http_completions import post
from tests.waiting import wait_for

pytestmark = pytest.mark.e2e  # real engine processes

WINDOW = 2048
# One template, hostile only for some first messages, so the same server serves ordinary chats.
TEMPLATE = (
    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{% set first = messages[0].content %}"
    "{% if first == 'spin' %}{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
    "{% elif first == 'flood' %}{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}"
    "{% elif first == 'deep' %}{{ f(0) }}"
    "{% elif first == 'wide' %}{% for i in range(10 ** 9) %}{% endfor %}"
    "{% elif first == 'big' %}{{ 'x' * 300000000 }}"
    "{% elif first == 'huge' %}{{ 'x'|center(2000000000) }}"
    "{% endif %}{% if false %}{{ 'y' * 300000000 }}{{ 'y'|center(300000000) }}{% endif %}"
    "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}{{ eos_token }}\n{% endfor %}<|assistant|>\n")


def checkpoint_with_template(root: Path) -> Path:
    model = root / "model"
    shutil.copytree(DEFAULT_MODEL_DIR, model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    return model


def start(root: Path, *extra: str) -> ServerProcess:
    config = write_config(root / "config.toml", model={"device": "cpu", "path": str(checkpoint_with_template(root))},
                          engine={"context_window": WINDOW, "kernels": "torch"},
                          pools={"prefill": {"pages": 256}, "decode": {"pages": 256}})
    server = ServerProcess(config, "--http-port", "0", *extra)
    server.wait_workers(server.client())
    return server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = start(tmp_path_factory.mktemp("hostile"))
    yield server
    server.stop()


def chat(server, content: str) -> tuple[int, dict]:
    return post(server, {"messages": [{"role": "user", "content": content}], "max_tokens": 2},
                path="/v1/chat/completions")


def peak_rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")))


def render_processes(server) -> dict[int, float]:
    """pid -> CPU seconds of each render process of this server."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == server.proc.pid and b"engine.http.template_worker" in cmdline:
            found[int(entry.name)] = (int(fields[11]) + int(fields[12])) / 100  # utime + stime, clock ticks
    return found


@pytest.mark.parametrize("content, limit, words", [
    ("spin", "cpu", ["2 s of CPU", "--chat-render-cpu-s"]),
    ("flood", "output", ["passed 4,194,304 bytes"]),
    ("deep", "recursion", ["deeper than 1,000 Python frames"]),
    ("wide", "range", ["range(1000000000) has 1,000,000,000 items; the limit is 100,000"]),
    ("big", "operator", ["would build 300,000,000 items; the limit is 4,194,304"]),
    ("huge", "memory", ["more than 512 MiB"]),
])
def test_each_render_limit_is_a_400_naming_it(server, content, limit, words):
    status, body = chat(server, content)
    assert status == 400, body
    error = body["error"]
    assert error["code"] == "chat_template_limit" and error["param"] == "messages"
    assert f"hit its {limit} limit" in error["message"] and all(w in error["message"] for w in words), error
    status, body = chat(server, "hello")  # and the next chat is served
    assert status == 200 and body["choices"][0]["message"]["role"] == "assistant"


def test_a_huge_constant_in_a_branch_never_taken_costs_the_supervisor_nothing(server):
    before = peak_rss_kib(server.proc.pid)
    for _ in range(3):
        status, body = chat(server, "hello")
        assert status == 200, body
    assert peak_rss_kib(server.proc.pid) - before < 64 << 10  # was +1.1 GiB: compiled, folded, per request


def test_a_text_prompt_past_the_byte_limit_is_refused_before_tokenizing(server):
    size = 4 << 20
    status, body = post(server, {"prompt": "a" * size, "max_tokens": 4})
    assert status == 400 and body["error"]["code"] == "admission_rejected", body
    limit = WINDOW * MAX_BYTES_PER_TOKEN
    assert (f"rejected before tokenizing: the prompt is {size:,} bytes; the limit is {limit:,} (context window "
            f"{WINDOW:,} tokens x {MAX_BYTES_PER_TOKEN} bytes per token") in body["error"]["message"]
    status, body = post(server, {"prompt": "a" * (limit + 1), "max_tokens": 4})  # one byte past it
    assert status == 400 and f"{limit + 1:,} bytes" in body["error"]["message"]
    server.check_alive()


def test_everyone_is_served_while_a_render_spins_and_a_hang_up_stops_it(tmp_path):
    """The render's budget is an hour here, so it is certainly still running when the others
    are answered; the client that asked for it hangs up, and its render process goes."""
    server = start(tmp_path, "--chat-render-cpu-s", "3600")
    try:
        url = urllib.parse.urlparse(server.ready["http"])
        body = json.dumps({"messages": [{"role": "user", "content": "spin"}], "max_tokens": 2}).encode()
        hostile = socket.create_connection((url.hostname, url.port), timeout=60)
        hostile.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        spinning = wait_for(lambda: [pid for pid, cpu in render_processes(server).items() if cpu > 1.0], 120,
                            "a render process past 1 s of CPU")
        assert server.client().ping()["pong"] > 0
        with urllib.request.urlopen(server.ready["http"] + "/v1/models", timeout=60) as response:
            assert json.loads(response.read())["data"][0]["max_model_len"] == WINDOW
        status, answer = chat(server, "hello")  # another client's chat, on the other render process
        assert status == 200 and answer["choices"][0]["message"]["role"] == "assistant"
        status, answer = post(server, {"prompt": "hello", "max_tokens": 2})
        assert status == 200 and answer["choices"][0]["text"] is not None
        assert select.select([hostile], [], [], 0)[0] == []  # the hostile render has not answered
        assert spinning[0] in render_processes(server)
        hostile.close()  # hang up: the render stops with its request
        wait_for(lambda: spinning[0] not in render_processes(server), 120, "the hung-up render's process to end")
        status, answer = chat(server, "hello")
        assert status == 200

        again = socket.create_connection((url.hostname, url.port), timeout=60)  # a spin while serve is stopped
        again.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        spinning = wait_for(lambda: [pid for pid, cpu in render_processes(server).items() if cpu > 1.0], 120,
                            "a render process past 1 s of CPU")
        server.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: server.proc.poll() is not None, 120, "serve to exit on SIGTERM")  # it ignored it for 20 s
        wait_for(lambda: not Path(f"/proc/{spinning[0]}").exists(), 60, "the render process to end with serve")
        again.close()
    finally:
        server.stop()
