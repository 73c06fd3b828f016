"""What hostile chat templates and prompts cost everyone else on a real `serve --http-port 0`:

    python bench/hostile_inputs.py [--cases loop const recursion range big_prompt] [--watch 4]

  spin        the checkpoint's chat_template is two nested range(100000) loops printing nothing;
              watched as `loop` is
  loop        the checkpoint's chat_template is two nested range(100000) loops printing "x";
              one chat request, and for --watch seconds: the slowest control ping, the slowest
              GET /v1/models, another client's completion, the supervisor's RSS growth; then
              how long serve takes to exit on SIGTERM
  const       'x' * 300000000 in a branch never taken: each request's time and the
              supervisor's peak RSS above where it started
  recursion   a macro that calls itself without end: the HTTP status and message
  range       range(10 ** 9): the HTTP status and message
  big_prompt  a 4 MiB text prompt that admission rejects (window 2048), sent while another
              client streams: the longest gap between that stream's tokens, the slowest ping
  limit_prompt  the same with the longest text prompt the byte limit lets through (window x 32
              bytes: tokenized, then rejected by admission)

Each case starts its own server (CPU, canaries off) on a copy of the default checkpoint with
the template written into its tokenizer_config.json. Prints one JSON line per case.
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import itertools

from engine.client.local_server import LocalServer, write_config
from engine.config import DEFAULT_MODEL_DIR

TEMPLATES = {
    "spin": "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
    "loop": "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}",
    "const": "{% if false %}{{ 'x' * 300000000 }}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}",
    "recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "range": "{% for i in range(10 ** 9) %}{% endfor %}{{ messages[0].content }}",
    "big_prompt": None,
    "limit_prompt": None,
}
WINDOW = 2048


def post(url: str, body: dict, timeout: float = 600) -> tuple[int, dict]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def start(root: Path, template: str | None) -> LocalServer:
    model = root / "model"
    shutil.copytree(DEFAULT_MODEL_DIR, model)
    if template is not None:
        config = json.loads((model / "tokenizer_config.json").read_text())
        (model / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    config = write_config(root / "config.toml", model={"device": "cpu", "path": str(model)},
                          engine={"context_window": WINDOW, "kernels": "torch"},
                          pools={"prefill": {"pages": 256}, "decode": {"pages": 256}})
    server = LocalServer(config, "--http-port", "0")
    server.wait_workers(server.client())
    return server


def chat(server, content: str = "hi") -> tuple[float, int, dict]:
    began = time.perf_counter()
    try:
        status, body = post(server.ready["http"] + "/v1/chat/completions",
                            {"messages": [{"role": "user", "content": content}], "max_tokens": 4})
    except (OSError, http.client.HTTPException) as exc:  # the server went away under it
        status, body = 0, {"error": {"message": f"{type(exc).__name__}: {exc}"}}
    return time.perf_counter() - began, status, body


def timed(fn) -> float:
    """Seconds fn took; a failure (the server reset the connection, say) counts as infinite."""
    began = time.perf_counter()
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - measured, and said
        print(f"  ({type(exc).__name__}: {exc} after {time.perf_counter() - began:.2f} s)", file=sys.stderr)
        return float("inf")
    return time.perf_counter() - began


RSS_GUARD_MB = 3072  # a server past this is killed at once: the machine is shared


def watch(server, seconds: float) -> dict:
    """While something hostile runs, for `seconds`: the slowest control ping, GET /v1/models
    and another client's completion (each probe in its own thread, so one that never returns
    is seen as never returning and the others go on), and the supervisor's RSS."""
    client = server.client(timeout_s=seconds + 1)
    end = time.monotonic() + seconds
    probes = {"ping": client.ping,
              "models": lambda: urllib.request.urlopen(server.ready["http"] + "/v1/models", timeout=seconds + 1).read(),
              "completion": lambda: post(server.ready["http"] + "/v1/completions", {"prompt": "hello", "max_tokens": 4},
                                         timeout=seconds + 1)}
    worst = {name: 0.0 for name in probes}

    def probe(name):
        while time.monotonic() < end:
            began = time.monotonic()
            took = timed(probes[name])
            worst[name] = max(worst[name], took if took != float("inf") else time.monotonic() - began)
            if took == float("inf"):
                worst[name] = float("inf")
                return
            time.sleep(0.05)

    threads = [threading.Thread(target=probe, args=(n,), daemon=True) for n in probes]
    for thread in threads:
        thread.start()
    rss = [rss_mb(server.proc.pid)]
    while time.monotonic() < end:
        rss.append(rss_mb(server.proc.pid))
        if rss[-1] > RSS_GUARD_MB:
            server.proc.kill()
            break
        time.sleep(0.05)
    for name, thread in zip(probes, threads):  # a probe still waiting has waited the whole window
        thread.join(0.1)
        if thread.is_alive():
            worst[name] = float("inf")
    return {**{f"max_{name}_s": round(t, 3) for name, t in worst.items()},
            "rss_growth_mb": round(max(rss) - rss[0], 1),
            "rss_growth_mb_per_s": round((max(rss) - rss[0]) / seconds, 1)}


def sigterm_exit_s(server, limit_s: float = 20.0) -> float:
    """Seconds serve took to exit on SIGTERM; past limit_s it is killed (inf)."""
    began = time.perf_counter()
    server.proc.send_signal(signal.SIGTERM)
    try:
        server.proc.wait(limit_s)
    except Exception:  # noqa: BLE001 - still stuck: say so and kill it
        server.proc.kill()
        server.proc.wait()
        return float("inf")
    return time.perf_counter() - began


def case_loop(server, args) -> dict:
    answer: dict = {}
    thread = threading.Thread(target=lambda: answer.update(zip(("s", "status", "body"), chat(server))), daemon=True)
    thread.start()
    time.sleep(0.5)
    seen = watch(server, args.watch)
    thread.join(0.1)
    seen["chat"] = {"status": answer.get("status"), "s": round(answer.get("s", 0), 3),
                    "message": (answer.get("body") or {}).get("error", {}).get("message")} if answer else "still running"
    seen["sigterm_exit_s"] = round(sigterm_exit_s(server), 2) if server.proc.poll() is None else "killed (RSS guard)"
    return seen


def case_const(server, args) -> dict:
    base = rss_mb(server.proc.pid)
    peak = [base]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak.append(rss_mb(server.proc.pid))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    runs = [chat(server) for _ in range(3)]
    stop.set()
    sampler.join()
    return {"request_s": [round(s, 3) for s, _, _ in runs], "status": [st for _, st, _ in runs],
            "supervisor_peak_rss_above_start_mb": round(max(peak) - base, 1),
            "message": runs[0][2].get("error", {}).get("message") if runs[0][1] != 200 else None}


def case_status(server, args) -> dict:
    s, status, body = chat(server)
    return {"status": status, "s": round(s, 3), "message": body.get("error", {}).get("message")}


def case_big_prompt(server, args, size: int = 4 << 20) -> dict:
    url = server.ready["http"] + "/v1/completions"
    arrivals: list[float] = []

    def stream():
        body = {"prompt": "stream me", "max_tokens": 1500, "ignore_eos": True, "stream": True, "temperature": 0}
        request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as response:
            for line in response:
                if line.startswith(b"data: "):
                    arrivals.append(time.perf_counter())

    streamer = threading.Thread(target=stream, daemon=True)
    streamer.start()
    while len(arrivals) < 20:
        time.sleep(0.01)
    sent = time.perf_counter()
    big: dict = {}
    sender = threading.Thread(target=lambda: big.update(zip(("status", "body"), post(url, {"prompt": "a" * size,
                                                                                         "max_tokens": 4}))))
    sender.start()
    client = server.client(timeout_s=600)
    pings = []
    while sender.is_alive():
        pings.append(timed(client.ping))
        time.sleep(0.02)
    answered = time.perf_counter() - sent
    streamer.join(600)
    during = [b - a for a, b in itertools.pairwise(arrivals) if b >= sent]
    return {"big_prompt_status": big.get("status"), "big_prompt_answer_s": round(answered, 3),
            "message": big.get("body", {}).get("error", {}).get("message"),
            "max_stream_gap_s": round(max(during), 3) if during else None,
            "median_stream_gap_s": round(sorted(during)[len(during) // 2], 4) if during else None,
            "max_ping_s": round(max(pings), 3) if pings else None}


CASES = {"spin": case_loop, "loop": case_loop, "const": case_const, "recursion": case_status, "range": case_status,
         "big_prompt": case_big_prompt,
         "limit_prompt": lambda server, args: case_big_prompt(server, args, WINDOW * 32)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--watch", type=float, default=4.0, help="seconds to watch the loop case (default 4)")
    args = parser.parse_args()
    for name in args.cases:
        root = Path(tempfile.mkdtemp(prefix=f"hostile-{name}-"))
        server = start(root, TEMPLATES[name])
        try:
            result = CASES[name](server, args)
        finally:
            if server.proc.poll() is None:
                server.stop()
            shutil.rmtree(root, ignore_errors=True)
        print(json.dumps({"case": name, **result}), flush=True)


if __name__ == "__main__":
    main()
