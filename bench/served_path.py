"""Where the served path loses throughput (issue 17, part 2): the same requests through
three doors, measured side by side in one run, interleaved, median and best of --reps:

    python bench/served_path.py [--reps 5] [--new-tokens 128] [--prompt 64] [--concurrency 1 16] [--model DIR]

  in process  the engine in this process (`Engine.generate`), no server;
  ZeroMQ      `serve` (canaries off) asked through EngineClient (the CLI's door);
  HTTP        the same `serve`'s `POST /v1/completions`, non-streamed, one request per
              connection thread (what an OpenAI client does).
Greedy, `ignore_eos`, the default checkpoint (or --model). Prints tokens/s and the ratios served / in
process; the goal of issue 17 is served >= 0.8x in process. Run it on a quiet machine: with
another CPU-heavy process beside it, torch's threads wait on each other (measured here
beside a busy loop: in process at batch 1, 94 tok/s with one thread, 7.8 with two).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from engine.client.local_server import LocalServer, write_config  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.core import Engine  # noqa: E402
from engine.model.load import load_model  # noqa: E402
from engine.request import SamplingParams  # noqa: E402


def prompts(n: int, length: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 256, (length,), generator=gen).tolist() for _ in range(n)]


def in_process(engine, batch, new) -> float:
    start = time.perf_counter()
    done = engine.generate(batch, SamplingParams(max_new_tokens=new, ignore_eos=True))
    assert all(len(r.output_ids) == new for r in done)
    return len(batch) * new / (time.perf_counter() - start)


def over_zmq(endpoint: str, batch, new) -> float:
    from engine.client import EngineClient

    def one(ids):
        client = EngineClient(endpoint, timeout_s=600)
        try:
            out = client.generate(ids, max_new_tokens=new, ignore_eos=True, temperature=0.0)
            assert len(out["token_ids"]) == new, out
        finally:
            client.close()

    start = time.perf_counter()
    with ThreadPoolExecutor(len(batch)) as pool:
        list(pool.map(one, batch))
    return len(batch) * new / (time.perf_counter() - start)


def over_http(url: str, batch, new) -> float:
    def one(ids):
        body = json.dumps({"prompt": ids, "max_tokens": new, "ignore_eos": True, "temperature": 0}).encode()
        req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            out = json.loads(r.read())
        assert out["usage"]["completion_tokens"] == new, out

    start = time.perf_counter()
    with ThreadPoolExecutor(len(batch)) as pool:
        list(pool.map(one, batch))
    return len(batch) * new / (time.perf_counter() - start)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    p.add_argument("--threads", type=int, default=os.cpu_count(),
                   help="torch threads of the in-process engine (a served worker gets cores / workers)")
    p.add_argument("--model", default="", help="a checkpoint directory (default: the embedded copy model)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model = {"path": str(Path(args.model).resolve())} if args.model else {}
    config = EngineConfig().replace(model={"device": "cpu", **model}, engine={"max_batch": 64, "kernels": "torch"},
                                    canaries={"enabled": False})
    engine = Engine(config, load_model(config.model.resolved_path(), device="cpu"))
    work = Path(tempfile.mkdtemp(prefix="pw-served-"))
    server = LocalServer(write_config(work / "c.toml", model=model, engine={"max_batch": 64},
                                      canaries={"enabled": False}), "--http-port", "0")
    try:
        server.wait_workers(server.client())
        url = server.ready["http"]
        print(f"cpu cores {os.cpu_count()}, torch threads here {torch.get_num_threads()}, prompt {args.prompt}, "
              f"new {args.new_tokens}, reps {args.reps}", flush=True)
        for n in args.concurrency:
            batch = prompts(n, args.prompt)
            doors = {"in process": lambda: in_process(engine, batch, args.new_tokens),
                     "ZeroMQ": lambda: over_zmq(server.control, batch, args.new_tokens),
                     "HTTP": lambda: over_http(url, batch, args.new_tokens)}
            for fn in doors.values():  # warm
                fn()
            got = {name: [] for name in doors}
            for _ in range(args.reps):
                for name, fn in doors.items():
                    got[name].append(fn())
            base = statistics.median(got["in process"])
            print(f"\n{n} concurrent: tokens/s median / best, and median / in process")
            for name, runs in got.items():
                med = statistics.median(runs)
                print(f"  {name:10s} {med:9,.0f} / {max(runs):9,.0f}   {med / base:5.2f}x", flush=True)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
