"""The vLLM agent's cost on vLLM's throughput (issue 16: at most 3% lost), the same workload
against real vLLM, agent on and off, side by side in one run.

    .venv/bin/python bench/vllm_agent_overhead.py [--mode toggle|starts] [--requests 256]
        [--concurrency 16] [--new-tokens 64] [--blocks 10] [--reps 4] [--runs 3] [--pin]

toggle (default): ONE vLLM server with the agent loaded; the workload runs in alternating
  blocks with the agent watching and paused (the `pause` op: no snapshots, no checks, no
  publishing). Both sides share the same process, CPU placement and warm caches, so what
  differs is the agent's work. On this 2-core VM, two starts of the same configuration
  differed by up to 6x in throughput (674 vs 4,188 tok/s), far more than any agent effect.
  What toggle does not measure is the agent being loaded at all (its hooks, called each step,
  return at once): `starts --paused` compares that against no connector, across restarts.
starts: one server at a time, alternating starts, agent on vs no connector (with --paused:
  the agent loaded but paused vs no connector). Prints the spread between starts too.

Needs `make vllm-venv`. Run it on a quiet machine: an idle vLLM spins (sched_yield), so
never with a second vLLM up; a busy neighbour shows as noise.
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

from engine.client.engine_client import EngineClient  # noqa: E402
from tests.vllm.vllm_server import VllmServer  # noqa: E402

FAULTS_ENV = {"PAGEWARDEN_ALLOW_FAULTS": "1"}  # the agent's `pause` op is a bench/test op


def timed_run(server: VllmServer, prompts: list[str], new_tokens: int, concurrency: int) -> tuple[float, float]:
    """(tokens/s, seconds) of one workload run."""
    start = time.perf_counter()
    with cf.ThreadPoolExecutor(concurrency) as pool:
        replies = list(pool.map(lambda p: server.complete(p, new_tokens, ignore_eos=True), prompts))
    elapsed = time.perf_counter() - start
    tokens = sum(r["usage"]["completion_tokens"] for r in replies)
    return tokens / elapsed, elapsed


def run(server: VllmServer, prompts: list[str], new_tokens: int, concurrency: int) -> float:
    return timed_run(server, prompts, new_tokens, concurrency)[0]


def workload(n: int) -> list[str]:
    """Shared prefixes (prefix caching is on), so the agent sees shared blocks too."""
    heads = ["the quick brown fox jumps over the lazy dog ", "lorem ipsum dolor sit amet ",
             "river stone light cloud north "]
    return [heads[i % 3] * 3 + f"request {i} " + "x" * (i % 50) for i in range(n)]


def agent_counts(client: EngineClient) -> tuple[int, float, float]:
    """(snapshots taken, seconds on vLLM's scheduler thread, CPU seconds of the agent's thread)."""
    status = client.call("status", brief=True)
    cost = status.get("cost", {})
    return (int(status["counters"].get("snapshots", 0)), float(cost.get("scheduler_s", 0.0)),
            float(cost.get("thread_cpu_s", 0.0)))


def toggle(args, prompts: list[str], pin) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {"agent on": [], "agent paused": []}
    shares: dict[str, list[float]] = {"scheduler": [], "thread": []}
    with VllmServer(agent={}, pin=pin, env=FAULTS_ENV) as server, EngineClient(server.agent_control) as client:
        run(server, prompts[:64], args.new_tokens, args.concurrency)  # warm-up, agent on
        for block in range(args.blocks):
            order = (False, True) if block % 2 == 0 else (True, False)
            line = []
            for paused in order:
                client.call("pause", paused=paused)
                time.sleep(0.2)  # snapshots queued before the pause are checked and counted first
                before = agent_counts(client)
                rate, elapsed = timed_run(server, prompts, args.new_tokens, args.concurrency)
                taken, sched_s, cpu_s = (b - a for a, b in zip(before, agent_counts(client)))
                if paused == (taken > 0):  # the bench must measure what it says it does
                    raise RuntimeError(f"agent {'paused' if paused else 'on'} but {taken} snapshots were taken")
                name = "agent paused" if paused else "agent on"
                results[name].append(rate)
                detail = f"{taken} snapshots"
                if not paused:
                    shares["scheduler"].append(sched_s / elapsed)
                    shares["thread"].append(cpu_s / elapsed)
                    detail += f"; scheduler {sched_s / elapsed:.2%}, agent thread {cpu_s / elapsed:.2%} of the run"
                line.append(f"{name} {rate:,.0f} tok/s ({detail})")
            print(f"block {block + 1}: " + "  ".join(line), flush=True)
    print(f"\nthe agent's own accounting (agent on, median of {args.blocks} runs): snapshot copies on vLLM's "
          f"scheduler thread {statistics.median(shares['scheduler']):.2%} of the wall time (the most it can "
          f"slow vLLM's steps), the agent's thread {statistics.median(shares['thread']):.2%} of one core "
          "(checks, publishing; it holds the GIL of vLLM's engine-core process while it runs)")
    return results


def starts(args, prompts: list[str], pin) -> dict[str, list[float]]:
    off = "agent loaded, paused" if args.paused else "agent on"
    results: dict[str, list[float]] = {off: [], "no connector": []}
    for rep in range(args.reps):
        order = (True, False) if rep % 2 == 0 else (False, True)
        for with_agent in order:
            agent, env = ({}, FAULTS_ENV) if with_agent else (None, None)
            with VllmServer(agent=agent, pin=pin, env=env) as server:
                if with_agent and args.paused:
                    with EngineClient(server.agent_control) as client:
                        client.call("pause", paused=True)
                run(server, prompts[:64], args.new_tokens, args.concurrency)  # warm-up
                runs = [run(server, prompts, args.new_tokens, args.concurrency) for _ in range(args.runs)]
            results[off if with_agent else "no connector"].append(statistics.median(runs))
        print(f"start pair {rep + 1}: " + "  ".join(f"{n} {v[-1]:,.0f} tok/s" for n, v in results.items()),
              flush=True)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("toggle", "starts"), default="toggle")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--blocks", type=int, default=10, help="toggle: workload runs per side, alternating")
    ap.add_argument("--reps", type=int, default=4, help="starts: server starts per side, alternating")
    ap.add_argument("--runs", type=int, default=3, help="starts: workload runs per start (their median counts)")
    ap.add_argument("--paused", action="store_true", help="starts: the agent loaded but paused, vs no connector")
    ap.add_argument("--pin", action="store_true", help="vLLM's worker alone on one core, the rest and this "
                    "client on the other")
    args = ap.parse_args()
    prompts = workload(args.requests)
    pin = None
    if args.pin and len(os.sched_getaffinity(0)) >= 2:
        cores = sorted(os.sched_getaffinity(0))
        pin = (cores[0], cores[1])
        os.sched_setaffinity(0, {cores[1]})
    results = (toggle if args.mode == "toggle" else starts)(args, prompts, pin)
    (on, on_v), (off, off_v) = results.items()
    print(f"\n{args.mode}: {args.requests} requests x {args.new_tokens} new tokens, {args.concurrency} concurrent, "
          f"{len(on_v)} per side")
    for name, values in results.items():
        print(f"{name:22} median {statistics.median(values):,.0f} tok/s  best {max(values):,.0f}  "
              f"worst {min(values):,.0f}")
    ratio = statistics.median(on_v) / statistics.median(off_v)
    print(f"{on} / {off} (medians): {ratio:.3f}  ({(1 - ratio) * 100:+.1f}% lost; goal <= 3%)")
    if args.mode == "toggle":
        pairs = [a / b for a, b in zip(on_v, off_v)]
        print(f"per block pair on/paused: median {statistics.median(pairs):.3f}, "
              f"range {min(pairs):.3f} to {max(pairs):.3f}")


if __name__ == "__main__":
    main()
