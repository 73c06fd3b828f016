"""The isolation guard, measured:

    python bench/guard.py [--reps 5] [--requests 16] [--new-tokens 128] [--clean 10000] [--quick]

1. Overhead of canaries + the audit log on decode throughput, side by side in one run.
   In process: one engine with per-token provenance (what the read log and incident
   scoping are built from) against one without, alternating, 3 x reps each. Served:
   two servers with the same model and pools, one with the guard on (canaries at the
   default schedule, per-token provenance and the read log), one with both off; each
   repetition measures one, then the other (alternating which goes first), 2 x reps.
   Goal: <= 3%. On a 2-core machine shared by 6 processes the served figures are noisy;
   both estimates are printed.
2. The `clean` scenario at `--clean` ordinary requests (canaries ten a second, every
   defence on, no fault): the false-positive count, which must be 0.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from engine.client.local_server import LocalServer, write_config  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.guard.reproduce import run_scenario  # noqa: E402


def decode_run(client, requests: int, new_tokens: int) -> float:
    """Decode tokens per second over `requests` concurrent requests of 2-token prompts."""
    streams = [client.submit([256, i + 1], max_new_tokens=new_tokens, ignore_eos=True, stream=False)
               for i in range(requests)]
    start = time.perf_counter()
    for stream in streams:
        for msg in client.events(stream):
            if msg.op in ("done", "error"):
                break
    return requests * new_tokens / (time.perf_counter() - start)


def engine_run(engine, requests: int, new_tokens: int) -> float:
    """In-process decode tokens per second (no sockets, no other processes: little noise)."""
    from engine.request import SamplingParams

    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    batch = [engine.submit([256, i + 1], params) for i in range(requests)]
    engine.step()  # prefill (and the first token) outside the timed part
    start = time.perf_counter()
    engine.run_until_idle()
    assert all(len(r.output_ids) == new_tokens for r in batch)
    return requests * (new_tokens - 1) / (time.perf_counter() - start)


def engine_overhead(reps: int, requests: int, new_tokens: int) -> tuple[list[float], list[float]]:
    """The audit log's cost on the decode step itself: provenance on against off."""
    from engine.core import Engine

    base = EngineConfig().replace(model={"device": "cpu"}, engine={"kernels": "torch", "max_batch": requests})
    engines = {on: Engine(base.replace(audit={"provenance": on})) for on in (True, False)}
    for engine in engines.values():
        engine_run(engine, requests, 8)  # warm-up
    runs: dict[bool, list[float]] = {True: [], False: []}
    for rep in range(reps):
        for on in ((True, False) if rep % 2 == 0 else (False, True)):
            runs[on].append(engine_run(engines[on], requests, new_tokens))
    return runs[True], runs[False]


def overhead(tmp: Path, reps: int, requests: int, new_tokens: int) -> tuple[list[float], list[float]]:
    base = EngineConfig().replace(model={"device": "cpu"}, engine={"kernels": "torch", "max_batch": requests})
    configs = {
        "guard": write_config(tmp / "guard.toml", base, audit={"provenance": True},
                              canaries={"enabled": True, "per_minute": base.canaries.per_minute}),
        "bare": write_config(tmp / "bare.toml", base, audit={"provenance": False}, canaries={"enabled": False}),
    }
    servers = {name: LocalServer(path) for name, path in configs.items()}
    try:
        clients = {name: server.client(timeout_s=300) for name, server in servers.items()}
        for name, server in servers.items():
            server.wait_workers(clients[name])
            decode_run(clients[name], requests, 8)  # warm-up
        runs: dict[str, list[float]] = {"guard": [], "bare": []}
        for rep in range(reps):
            for name in (("guard", "bare") if rep % 2 == 0 else ("bare", "guard")):
                runs[name].append(decode_run(clients[name], requests, new_tokens))
        status = clients["guard"].status()
        canaries = status.get("counters", {}).get("canaries", 0)
        print(f"# canaries sent by the guarded server during the run: {canaries}")
        return runs["guard"], runs["bare"]
    finally:
        for server in servers.values():
            server.stop()


def _paired(runs: list[float], base: list[float]) -> float:
    """Median over repetitions of 1 - run / base (each pair measured back to back)."""
    costs = sorted(1 - r / b for r, b in zip(runs, base))
    return costs[len(costs) // 2]


def _row(name: str, runs: list[float], base: list[float] | None = None) -> None:
    median = sorted(runs)[len(runs) // 2]
    if base is None:
        print(f"| {name} | {max(runs):,.0f} | {median:,.0f} | | |")
    else:
        print(f"| {name} | {max(runs):,.0f} | {median:,.0f} | {1 - max(runs) / max(base):+.1%} "
              f"| {_paired(runs, base):+.1%} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5, help="overhead repetitions (0: skip the overhead part)")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--clean", type=int, default=10_000, help="requests in the clean scenario (0: skip)")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    args = parser.parse_args()
    if args.quick:
        args.reps, args.requests, args.new_tokens, args.clean = 1, 2, 8, 20
    print(f"# guard: {platform.machine()}, {os.cpu_count()} cores, best of {args.reps} (interleaved)")
    tmp = Path(tempfile.mkdtemp(prefix="pw-guard-"))

    if args.reps > 0:
        _overhead_tables(tmp, args)
    if args.clean:
        _clean(tmp, args.clean)


def _overhead_tables(tmp: Path, args) -> None:
    audited, plain = engine_overhead(3 * args.reps, args.requests, args.new_tokens)
    guarded, bare = overhead(tmp, 2 * args.reps, args.requests, args.new_tokens)
    print(f"\n| {args.requests} requests x {args.new_tokens} tokens, default model | decode tok/s (best) "
          f"| median | cost, best vs best | cost, median of paired runs |")
    print("|---|---:|---:|---:|---:|")
    _row("in-process engine, audit off", plain)
    _row("in-process engine, audit on", audited, plain)
    _row("served, canaries off, audit off", bare)
    _row("served, canaries on (default schedule), audit on", guarded, bare)
    cost = _paired(guarded, bare)
    spread = sorted(1 - g / b for g, b in zip(guarded, bare))
    print(f"\nserved cost, median of {len(spread)} back-to-back pairs: {cost:+.1%} (pairs range "
          f"{spread[0]:+.1%} .. {spread[-1]:+.1%}; goal <= 3%: {'met' if cost <= 0.03 else 'MISSED'})")


def _clean(tmp: Path, requests: int) -> None:
    start = time.perf_counter()
    (row,) = run_scenario("clean", scale=requests / 2000, workdir=tmp, log=lambda line: None)
    took = time.perf_counter() - start
    print("\n| clean scenario | requests | cross reads | alerts caught | false positives | verdict | time |")
    print("|---|---:|---:|---|---:|---|---:|")
    print(f"| all defences on, canaries due 10/s (at most 2 running) | {row.requests:,} | {row.reads} | "
          f"{row.caught or '—'} | {row.false_positives} | {'pass' if row.passed else 'FAIL: ' + row.why} | "
          f"{took:.0f} s |", flush=True)


if __name__ == "__main__":
    main()
