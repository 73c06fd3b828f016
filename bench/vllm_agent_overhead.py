"""The vLLM agent's cost on vLLM's throughput: the same workload against two real vLLM servers
side by side in one run, one with PageWarden's agent (engine/vllm_agent) and one
without, interleaved, so both see the same machine.

    .venv/bin/python bench/vllm_agent_overhead.py [--requests 256] [--concurrency 16] [--reps 5]

Needs `make vllm-venv`. Prints tok/s per repetition, the medians and the ratio; the goal
(issue 16) is at most 3% lost. Run it on a quiet machine: load from elsewhere shows as noise.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
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
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    # shared prefixes (prefix caching on in both), so the agent sees shared blocks too
    heads = ["the quick brown fox jumps over the lazy dog ", "lorem ipsum dolor sit amet ",
             "river stone light cloud north "]
    prompts = [heads[i % 3] * 3 + f"request {i} " + "x" * (i % 50) for i in range(args.requests)]
    with VllmServer(agent={}) as on, VllmServer() as off:
        for server in (on, off):  # warm-up
            run(server, prompts[:32], args.new_tokens, args.concurrency)
        results = {"agent on": [], "agent off": []}
        for rep in range(args.reps):
            order = [("agent on", on), ("agent off", off)] if rep % 2 == 0 else [("agent off", off), ("agent on", on)]
            for name, server in order:
                results[name].append(run(server, prompts, args.new_tokens, args.concurrency))
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
