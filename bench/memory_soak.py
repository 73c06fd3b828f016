"""Does the engine's memory level off under a long mixed load? RSS of the supervisor and of each
worker sampled through a soak, and the supervisor's own allocation sites (tracemalloc) compared
between the first sample after warm-up and the last.

    .venv/bin/python bench/memory_soak.py [--minutes 30] [--clients 6] [--sample-s 30] [--trace]

A real engine (default config, copy model, HTTP on) on loopback. The load, in --clients threads
until the time is up: streamed and unstreamed control-socket requests of random lengths, one
in eight cancelled mid-stream, one in sixteen rejected at admission (too long), HTTP completions
(some streamed), `status` and `audit` calls, and a new connection now and then (a client that
comes and goes). --trace runs the supervisor under tracemalloc (slower) and prints the sites
that grew most. Prints the RSS curve (MiB) and the growth per quarter of the run: a plateau is
the last quarters growing by about nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from engine.client.local_server import LocalServer, write_config  # noqa: E402


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def worker_names(server, client) -> dict[int, str]:
    return {int(w["pid"]): w["name"] for w in client.status()["workers"] if w.get("pid")}


def load(server, http_url: str | None, stop: threading.Event, seed: int, counts: dict) -> None:
    rng = random.Random(seed)
    client = server.client()
    model = None
    if http_url:
        with urllib.request.urlopen(f"{http_url}/v1/models", timeout=60) as resp:
            model = json.loads(resp.read())["data"][0]["id"]
    n = 0
    while not stop.is_set():
        n += 1
        if n % 50 == 0:  # a client that comes and goes
            client.close()
            client = server.client()
        kind = rng.random()
        try:
            if kind < 0.06:
                stream = client.submit([256] + [rng.randrange(20, 250) for _ in range(5000)], max_new_tokens=4000)
                list(client.events(stream, timeout_s=120))
                counts["rejected"] += 1
            elif kind < 0.55:
                prompt = [256] + [rng.randrange(20, 250) for _ in range(rng.randrange(4, 200))]
                stream = client.submit(prompt, max_new_tokens=rng.randrange(1, 64), ignore_eos=True,
                                       tenant=rng.choice(["a", "b", "c"]))
                cancel = rng.random() < 0.125
                for i, msg in enumerate(client.events(stream, timeout_s=120)):
                    if cancel and i == 3 and msg.get("request_id"):
                        client.cancel(msg.get("request_id"))
                    if msg.op == "done" and rng.random() < 0.1:
                        client.audit(msg.get("request_id"))
                counts["control"] += 1
            elif kind < 0.9 and http_url:
                body = {"model": model, "prompt": "soak " * rng.randrange(1, 40),
                        "max_tokens": rng.randrange(1, 48), "stream": rng.random() < 0.5}
                req = urllib.request.Request(f"{http_url}/v1/completions", json.dumps(body).encode(),
                                             {"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=120) as resp:
                    resp.read()
                counts["http"] += 1
            else:
                client.status()
                counts["status"] += 1
        except Exception as exc:  # noqa: BLE001 - counted, the soak goes on
            counts["errors"] += 1
            counts["last_error"] = f"{type(exc).__name__}: {exc}"[:200]
    client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--sample-s", type=float, default=30)
    parser.add_argument("--trace", action="store_true", help="tracemalloc in the supervisor (slower)")
    parser.add_argument("--json", help="write the samples here")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pw-soak-"))
    trace = tmp / "trace.jsonl"
    if args.trace:
        os.environ["PAGEWARDEN_TRACEMALLOC"] = str(trace)
    os.environ.setdefault("PAGEWARDEN_STATE_DIR", str(tmp / "state"))
    server = LocalServer(write_config(tmp / "config.toml"), "--http-port", "0")
    counts = {"control": 0, "http": 0, "status": 0, "rejected": 0, "errors": 0}
    stop = threading.Event()
    samples = []
    try:
        admin = server.client()
        server.wait_workers(admin)
        names = worker_names(server, admin)
        threads = [threading.Thread(target=load, args=(server, server.ready.get("http"), stop, i, counts),
                                    daemon=True) for i in range(args.clients)]
        for t in threads:
            t.start()
        begin = time.monotonic()
        end = begin + args.minutes * 60
        while True:
            names.update(worker_names(server, admin))
            pids = [server.proc.pid, *children(server.proc.pid)]
            sample = {"t_s": round(time.monotonic() - begin), "supervisor": round(rss_mib(server.proc.pid), 1),
                      **{names.get(p, str(p)): round(rss_mib(p), 1) for p in pids[1:]}, **{
                          k: v for k, v in counts.items() if k != "last_error"}}
            samples.append(sample)
            if args.trace:
                os.kill(server.proc.pid, 10 + 2)  # SIGUSR2
            print(json.dumps({**sample, "last_error": counts.get("last_error")}), flush=True)
            if time.monotonic() >= end:
                break
            time.sleep(min(args.sample_s, max(0.0, end - time.monotonic())))
        stop.set()
        for t in threads:
            t.join(180)
    finally:
        server.stop()
    keys = [k for k in samples[0] if k not in ("t_s", *counts)]
    quarter = max(1, len(samples) // 4)
    print("\n# RSS growth (MiB) per quarter of the run:")
    for k in keys:
        series = [s.get(k, 0.0) for s in samples]
        marks = [series[min(i * quarter, len(series) - 1)] for i in range(4)] + [series[-1]]
        print(f"  {k:>12}: start {series[0]:.0f}, end {series[-1]:.0f}; quarters "
              + ", ".join(f"{b - a:+.1f}" for a, b in zip(marks, marks[1:])))
    print(f"# load: {counts}")
    if args.trace and trace.exists():
        dumps = [json.loads(line) for line in trace.read_text().splitlines()]
        if len(dumps) >= 3:
            first, last = dumps[1], dumps[-1]  # the first after warm-up
            before = {t["where"]: t["size"] for t in first["top"]}
            grew = sorted(((t["size"] - before.get(t["where"], 0), t["where"], t["count"]) for t in last["top"]),
                          reverse=True)[:12]
            print(f"# supervisor traced: {first['traced'] / 2**20:.1f} -> {last['traced'] / 2**20:.1f} MiB; grew most:")
            for delta, where, count in grew:
                print(f"  {delta / 2**20:+8.2f} MiB  {where}  ({count:,} blocks)")
    if args.json:
        Path(args.json).write_text(json.dumps(samples))
    return 0


if __name__ == "__main__":
    sys.exit(main())
