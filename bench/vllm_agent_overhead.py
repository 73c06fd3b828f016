"""The vLLM agent's cost on vLLM's throughput: the same workload against real vLLM servers in
one run, with PageWarden's agent (engine/vllm_agent) and without, interleaved, so both
see the same machine. Only one server runs at a time: an idle vLLM's engine and worker
processes keep spinning (sched_yield), so with both up on a 2-core machine each measured the
other's idle loop as much as its own work.

    .venv/bin/python bench/vllm_agent_overhead.py [--requests 256] [--concurrency 16] [--reps 4] [--runs 3]

Needs `make vllm-venv`. Prints tok/s per repetition, the medians and the ratio; the goal
(issue 16) is at most 3% lost. Run it on a quiet machine: load from elsewhere shows as noise.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.vllm.vllm_server import VllmServer  # noqa: E402


def run(server: VllmServer, prompts: list[str], new_tokens: int, concurrency: int) -> float:
    start = time.perf_counter()
    with cf.ThreadPoolExecutor(concurrency) as pool:
        replies = list(pool.map(lambda p: server.complete(p, new_tokens, ignore_eos=True), prompts))
    elapsed = time.perf_counter() - start
    tokens = sum(r["usage"]["completion_tokens"] for r in replies)
    return tokens / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=4, help="server starts per contender, alternating")
    ap.add_argument("--pin", action="store_true", help="vLLM's worker alone on one core, the rest on the other "
                    "(measured noisier than leaving it to the OS on a 2-core VM)")
    ap.add_argument("--runs", type=int, default=3, help="workload runs per server start (their median counts)")
    args = ap.parse_args()
    # shared prefixes (prefix caching on in both), so the agent sees shared blocks too
    heads = ["the quick brown fox jumps over the lazy dog ", "lorem ipsum dolor sit amet ",
             "river stone light cloud north "]
    prompts = [heads[i % 3] * 3 + f"request {i} " + "x" * (i % 50) for i in range(args.requests)]
    results = {"agent on": [], "agent off": []}
    agent = {"on": {}, "off": None}
    pin = None
    if args.pin and len(os.sched_getaffinity(0)) >= 2:
        cores = sorted(os.sched_getaffinity(0))
        pin = (cores[0], cores[1])  # vLLM's model worker alone on one core; the rest, and this client, on another
        os.sched_setaffinity(0, {cores[1]})
    for rep in range(args.reps):
        order = ("on", "off") if rep % 2 == 0 else ("off", "on")
        for which in order:
            with VllmServer(agent=agent[which], pin=pin) as server:
                run(server, prompts[:32], args.new_tokens, args.concurrency)  # warm-up
                runs = [run(server, prompts, args.new_tokens, args.concurrency) for _ in range(args.runs)]
            results[f"agent {which}"].append(statistics.median(runs))
        print(f"rep {rep + 1}: " + "  ".join(f"{n} {v[-1]:,.0f} tok/s" for n, v in results.items()), flush=True)
    med = {n: statistics.median(v) for n, v in results.items()}
    best = {n: max(v) for n, v in results.items()}
    print(f"\n{args.requests} requests x {args.new_tokens} new tokens, {args.concurrency} concurrent, {args.reps} reps")
    for name in results:
        print(f"{name:10} median {med[name]:,.0f} tok/s  best {best[name]:,.0f} tok/s")
    ratio = med["agent on"] / med["agent off"]
    print(f"agent on / off (median): {ratio:.3f}  ({(1 - ratio) * 100:+.1f}% lost; goal <= 3%)")


if __name__ == "__main__":
    main()
