"""Fair shares between clients: how long one client's short request takes while another client
has a thousand requests queued (each within its budget), against the same request on an idle
engine, in one run.

    .venv/bin/python bench/fairness.py [--queued 1000] [--new-tokens 16] [--repeats 3]

A real engine (default config, copy model) on loopback; client A submits --queued requests of
--new-tokens tokens and waits until every one is accepted; then client B submits one 8-token
request and the time to its `done` is measured (submit to done, as B sees it). Before fair
queueing B's request waited behind every one of A's (the finding: 0.01 s -> 11.1 s for 1,000).
To measure an older commit, run this file with PYTHONPATH pointing at that commit's checkout.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] or Path(__file__).resolve().parent.parent)
sys.path.insert(0, str(REPO))

from engine.client.local_server import LocalServer, write_config  # noqa: E402


def short_request(client) -> float:
    begin = time.perf_counter()
    stream = client.submit([256, 5, 6], max_new_tokens=8, ignore_eos=True)
    for msg in client.events(stream, timeout_s=600):
        if msg.op in ("done", "error"):
            if msg.op == "error" or msg.get("error"):
                raise SystemExit(f"B's request failed: {msg.header}")
    return time.perf_counter() - begin


def one_round(server, queued: int, new_tokens: int) -> tuple[float, float]:
    greedy, other = server.client(), server.client()
    idle = short_request(other)
    streams = [greedy.submit([256, 7, i % 200 + 20, 9], max_new_tokens=new_tokens, ignore_eos=True)
               for i in range(queued)]
    ids = [next(greedy.events(s, timeout_s=600)).get("request_id") for s in streams]
    loaded = short_request(other)
    for rid in ids:
        try:
            greedy.call("cancel", request_id=rid, timeout_s=60)
        except Exception:  # noqa: BLE001 - already finished
            pass
    greedy.close(), other.close()
    return idle, loaded


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queued", type=int, default=1000)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = LocalServer(write_config(Path(tmp) / "config.toml"))
        try:
            server.wait_workers(server.client())
            rounds = [one_round(server, args.queued, args.new_tokens) for _ in range(args.repeats)]
        finally:
            server.stop()
    idle = statistics.median(r[0] for r in rounds)
    loaded = statistics.median(r[1] for r in rounds)
    print(f"# fairness ({REPO}): B's 8-token request, median of {args.repeats}: idle engine {idle:.3f} s; "
          f"with A's {args.queued} queued requests of {args.new_tokens} tokens {loaded:.3f} s "
          f"({loaded / idle:.1f}x); rounds {[(round(a, 3), round(b, 3)) for a, b in rounds]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
