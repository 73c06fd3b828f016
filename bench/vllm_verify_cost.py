"""What the verifying connector costs a vLLM prefill/decode pair: throughput with every transfer
checked against the same pair with vLLM's ExampleConnector alone, in one interleaved run.

    .venv/bin/python bench/vllm_verify_cost.py [--model copy|llama135m ...] [--rounds 6]
        [--requests 48] [--concurrency 8] [--quick]

Two pairs run side by side on loopback (four vLLM 0.32 CPU processes from .venv-vllm, each
pair with its own store): "plain" (ExampleConnector as the producer's and the consumer's
connector) and "verified" (PageWardenVerifyingConnector around the same ExampleConnector, the
producer digesting every prompt block it saves, the consumer digesting and comparing every
block it loads, with the C++ digest module where it builds). Each round sends the same fresh
prompts (none of an earlier round, so the content-addressed store never serves an old file)
through both pairs, one after the other, the order alternating by round; a pair's figure is
requests completed per second through the router (prefill on the producer, then decode on the
consumer). The ratio verified/plain is taken per round; its median is the cost. The pair not
being measured is frozen (SIGSTOP to each of its process groups, SIGCONT after): on 2 cores
an idle vLLM's polling threads otherwise take time from the pair under test, and the
per-round ratios swung 0.59-1.22 that way.

Beside the ratio, the verified pair's own account of its work: each worker logs the seconds it
spent digesting saved blocks (producer) and checking loaded ones (consumer) ("PageWarden verify
cost", every 10 s while it works); over the seconds the verified pair was busy, that is the
share of the pair's time the checks took, a figure the machine's noise does not move.

Goal: cost <= 3% on the copy model and on the 135M-shape checkpoint (bench/make_random_llama.py).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import re
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.vllm import pd_router  # noqa: E402
from tests.vllm.pd_config import digest_backend, transfer_config  # noqa: E402
from tests.vllm.vllm_server import VllmServer  # noqa: E402

MODELS = {
    # name: (directory, prompt ids drawn from range(low, high))
    "copy": (REPO / "resources" / "models" / "pagewarden-copy", (32, 127)),
    "llama135m": (REPO / "build" / "models" / "random-llama-135m", (3, 49152)),
}
BLOCK = 32
BLOCKS = 256


def prompts(seed: int, n: int, low: int, high: int) -> list[tuple[list[int], int]]:
    """n (prompt ids, new tokens); lengths 80-200, none 1 past a multiple of the block size
    (ExampleConnector's consumer looks up one block short of what its producer saved there)."""
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        length = rng.randrange(80, 200)
        if length % BLOCK != 1:
            out.append(([rng.randrange(low, high) for _ in range(length)], rng.randrange(24, 40)))
    return out


def empty(store: str) -> None:
    for entry in os.scandir(store):
        shutil.rmtree(entry.path, ignore_errors=True)


def signal_pair(pair: dict, sig: int) -> None:
    for server in (pair["producer"], pair["consumer"]):
        os.killpg(server.proc.pid, sig)


def one_round(pair: dict, work, tag: str, concurrency: int, others=()) -> dict:
    empty(pair["store"])
    for other in others:
        signal_pair(other, signal.SIGSTOP)
    try:
        return _timed(pair, work, tag, concurrency)
    finally:
        for other in others:
            signal_pair(other, signal.SIGCONT)


def _timed(pair: dict, work, tag: str, concurrency: int) -> dict:
    begin = time.perf_counter()

    def send(item):
        i, (ids, new) = item
        return pd_router.complete(pair["producer"].url, pair["consumer"].url, ids, new, f"{tag}-{i}")

    with cf.ThreadPoolExecutor(concurrency) as pool:
        replies = list(pool.map(send, enumerate(work)))
    seconds = time.perf_counter() - begin
    manifests = sum(1 for r in replies if "pagewarden_manifest" in (r["sent_kv_transfer_params"] or {}))
    return {"seconds": seconds, "rps": len(work) / seconds, "manifests": manifests,
            "texts": [r["choices"][0]["text"] for r in replies]}


COST_LINE = re.compile(r"PageWarden verify cost: (\d+) blocks digested in ([\d.]+) s, (\d+) blocks checked in "
                       r"([\d.]+) s")


def verify_cost(server) -> tuple[int, float, int, float]:
    """The last cost line this vLLM logged: (blocks digested, s, blocks checked, s)."""
    found = COST_LINE.findall(server.log_path.read_text(errors="replace"))
    if not found:
        return 0, 0.0, 0, 0.0
    a, b, c, d = found[-1]
    return int(a), float(b), int(c), float(d)


def start_pair(model: Path, verified: bool, env: dict, stack) -> dict:
    store = tempfile.mkdtemp(prefix=f"pw-cost-{'v' if verified else 'p'}-")
    common = dict(model=model, num_blocks=BLOCKS, block_size=BLOCK, max_model_len=512, prefix_caching=False)
    args = ("--max-num-batched-tokens", "4096")
    producer = stack.enter_context(VllmServer(
        **common, env=env, extra_args=(*args, *transfer_config("kv_producer", store, verified=verified))))
    consumer = stack.enter_context(VllmServer(
        **common, env=env, extra_args=(*args, *transfer_config("kv_consumer", store, verified=verified))))
    return {"producer": producer, "consumer": consumer, "store": store}


def run_model(name: str, args, env: dict) -> dict:
    from contextlib import ExitStack

    model, (low, high) = MODELS[name]
    if not (model / "config.json").is_file():
        if name != "llama135m":
            raise SystemExit(f"no checkpoint at {model}")
        from bench.make_random_llama import write_checkpoint
        write_checkpoint(model)
    with ExitStack() as stack:
        t0 = time.perf_counter()
        pairs = {"plain": start_pair(model, False, env, stack), "verified": start_pair(model, True, env, stack)}
        print(f"  {name}: four vLLM instances ready in {time.perf_counter() - t0:.0f} s", flush=True)
        warm = prompts(10_000, args.concurrency, low, high)
        busy = 0.0  # seconds the verified pair was serving, all rounds
        for kind, pair in pairs.items():
            took = one_round(pair, warm, f"warm-{kind}", args.concurrency, [p for k, p in pairs.items() if k != kind])
            busy += took["seconds"] if kind == "verified" else 0.0
        ratios, figures, identical, compared, unverified = [], {"plain": [], "verified": []}, 0, 0, 0
        for r in range(args.rounds):
            work = prompts(r, args.requests, low, high)
            order = ("plain", "verified") if r % 2 == 0 else ("verified", "plain")
            got = {kind: one_round(pairs[kind], work, f"r{r}-{kind}", args.concurrency,
                                   [p for k, p in pairs.items() if k != kind]) for kind in order}
            for kind in got:
                figures[kind].append(got[kind]["rps"])
            busy += got["verified"]["seconds"]
            ratios.append(got["verified"]["rps"] / got["plain"]["rps"])
            identical += sum(a == b for a, b in zip(got["plain"]["texts"], got["verified"]["texts"]))
            compared += len(work)
            unverified += len(work) - got["verified"]["manifests"]
            print(f"  {name} round {r}: plain {got['plain']['rps']:.2f} req/s, verified "
                  f"{got['verified']['rps']:.2f} req/s, ratio {ratios[-1]:.3f}", flush=True)
        # one more small round after the workers' log period, so that their last cost lines cover every round
        time.sleep(11)
        busy += one_round(pairs["verified"], prompts(20_000, 2, low, high), "flush", 2, [pairs["plain"]])["seconds"]
        digested, digest_s, _, _ = verify_cost(pairs["verified"]["producer"])
        _, _, checked, check_s = verify_cost(pairs["verified"]["consumer"])
        failed = pairs["verified"]["consumer"].log_path.read_text(errors="replace").count("PageWarden transfer_mismatch")
        for pair in pairs.values():
            shutil.rmtree(pair["store"], ignore_errors=True)
    return {"model": name, "rounds": args.rounds, "requests_per_round": args.requests,
            "concurrency": args.concurrency, "plain_rps_median": statistics.median(figures["plain"]),
            "verified_rps_median": statistics.median(figures["verified"]), "ratio_median": statistics.median(ratios),
            "ratio_min": min(ratios), "ratio_max": max(ratios), "identical_outputs": f"{identical}/{compared}",
            "requests_without_manifest": unverified, "transfer_mismatches": failed,
            "verified_busy_s": round(busy, 2), "blocks_digested": digested, "digest_s": round(digest_s, 4),
            "blocks_checked": checked, "check_s": round(check_s, 4),
            "own_share": (digest_s + check_s) / busy if busy else 0.0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", choices=sorted(MODELS), help="default: copy and llama135m")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=48, help="requests per round per pair")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="copy model, 2 rounds of 8: checks the script")
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    if args.quick:
        args.model, args.rounds, args.requests, args.concurrency = ["copy"], 2, 8, 4
    backend, env = digest_backend()
    print(f"# vllm_verify_cost: {os.cpu_count()} cores, digest on {backend}", flush=True)
    results = [run_model(name, args, env) for name in (args.model or ["copy", "llama135m"])]
    print("\n| model | plain req/s | verified req/s | verified/plain (median, min-max) | cost | identical | "
          "no manifest | mismatches |\n|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['model']} | {r['plain_rps_median']:.2f} | {r['verified_rps_median']:.2f} | "
              f"{r['ratio_median']:.3f} ({r['ratio_min']:.3f}-{r['ratio_max']:.3f}) | "
              f"{(1 - r['ratio_median']) * 100:.1f}% | {r['identical_outputs']} | {r['requests_without_manifest']} | "
              f"{r['transfer_mismatches']} |")
    print("\nThe verifier's own time (its workers' account), against the seconds the verified pair was busy:\n\n"
          "| model | blocks digested (producer) | s | blocks checked (consumer) | s | busy s | own share |\n"
          "|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['model']} | {r['blocks_digested']:,} | {r['digest_s']:.3f} | {r['blocks_checked']:,} | "
              f"{r['check_s']:.3f} | {r['verified_busy_s']:.1f} | {r['own_share'] * 100:.2f}% |")
    if args.json:
        Path(args.json).write_text(json.dumps({"digest_backend": backend, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
