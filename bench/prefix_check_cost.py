"""What the extended I1 check costs: a decode step over shared pages with the prefix-key check
and without it, side by side in one run.

    .venv/bin/python bench/prefix_check_cost.py [--batch 16 64] [--steps 40] [--rounds 5]

An Engine on the default model with the prefix cache on: 3 system prompts of 512 tokens, each
request one of them plus 64 tokens of its own, so every decode step reads 32 shared pages per
request. Timed: whole decode steps (`Engine.step`), alternating step by step, as built (every shared
page's key compared in the C++ plan) and with the key tensors withheld from the kernel (the
check as it was before shared pages: tags only). Printed: median step time of each
and their ratio, and the decode plan alone (`plan_decode`) with and without keys.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.config import DEFAULT_MODEL_DIR, EngineConfig  # noqa: E402
from engine.core import Engine  # noqa: E402
from engine.request import SamplingParams  # noqa: E402


def engine_with_batch(batch: int, seed: int, new_tokens: int) -> Engine:
    rng = random.Random(seed)
    systems = [[256, *(rng.randrange(32, 127) for _ in range(511))] for _ in range(3)]
    config = EngineConfig().replace(model={"path": str(DEFAULT_MODEL_DIR), "device": "cpu"},
                                    engine={"page_size": 16, "max_batch": batch, "context_window": 4096,
                                            "max_prefill_tokens": 1 << 16},
                                    pools={"decode": {"pages": batch * ((576 + new_tokens) // 16 + 2) + 256}},
                                    canaries={"enabled": False})
    engine = Engine(config)
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    for s in systems:  # the system prompts, cached
        engine.submit(s + [rng.randrange(32, 127)], SamplingParams(max_new_tokens=1, ignore_eos=True))
    engine.run_until_idle()
    for i in range(batch):
        engine.submit(systems[i % 3] + [rng.randrange(32, 127) for _ in range(64)], params)
    engine.step()  # their prefill
    engine.step()
    hits = sum(r.cached_tokens > 0 for r in engine.scheduler.running)
    if hits != batch:
        raise SystemExit(f"only {hits} of {batch} requests found their system prompt cached")
    return engine


def timed_steps(engine: Engine, steps: int) -> tuple[list[float], list[float]]:
    """Alternate step by step (the context grows every step, so neither side gets the short
    ones): even steps as built, odd steps with the key tensors withheld from the kernel."""
    runner = engine.runner
    tables = runner._block_tables

    def without_keys(requests):
        got = tables(requests)
        return (*got[:4], None, got[5])

    keyed, plain = [], []
    try:
        for i in range(2 * steps):
            runner._block_tables = tables if i % 2 == 0 else without_keys
            t0 = time.perf_counter()
            engine.step()
            (keyed if i % 2 == 0 else plain).append(time.perf_counter() - t0)
    finally:
        runner._block_tables = tables
    return keyed, plain


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, nargs="+", default=[16, 64])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    print("| batch | shared pages read per step | step, keys checked (ms) | step, tags only (ms) | ratio |")
    print("|---:|---:|---:|---:|---:|")
    for batch in args.batch:
        engine = engine_with_batch(batch, seed=batch, new_tokens=2 * args.steps * args.rounds + 8)
        shared = sum(int(r.page_table.shared[: r.cached_tokens // 16].sum()) for r in engine.scheduler.running)
        keyed, plain = [], []
        for _ in range(args.rounds):
            k, t = timed_steps(engine, args.steps)
            keyed += k
            plain += t
        km, tm = statistics.median(keyed) * 1e3, statistics.median(plain) * 1e3
        print(f"| {batch} | {shared} | {km:.2f} | {tm:.2f} | {km / tm:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
