"""Prefill attention on the CPU, side by side in one run: SDPA (the engine's path where the C++
module is not built: per sequence, the cached prefix gathered from the pool, a mask), the C++
module's plain loops, and its vector path (on AVX-512 a block of query rows at a time as two
small matrix products; on AVX2 row by row).

Cases (8 query heads over 1 KV head, head_dim 128: the copy model's shape, unless --shape 135m):
    shared16   16 sequences of 64 new tokens, each after a cached prefix of 512 (the
               shared-prefix workload of vs_vllm.py: 3 system prompts)
    shared64   the same with 64 sequences
    plain16    16 sequences of 64 tokens, no prefix
    long1024   1 sequence of 1,024 tokens
    long2048   1 sequence of 2,048 tokens

Each contender runs --reps times per case, interleaved, with --threads torch threads (the
module uses them through at::parallel_for); printed: the best and median ms of one layer's
attention, GFLOP/s (scores and weighted sum, 4 flops per query head, key and dimension), and
SDPA's time over each C++ path's.

    .venv/bin/python bench/prefill_attention.py [--threads 1 2] [--reps 9] [--shape copy|135m]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels import cpu_extension  # noqa: E402

PAGE = 16
SHAPES = {"copy": (8, 1, 128), "135m": (9, 3, 64)}  # query heads, KV heads, head_dim
CASES = {  # sequences, new tokens each, cached prefix tokens each
    "shared16": (16, 64, 512), "shared64": (64, 64, 512), "plain16": (16, 64, 0),
    "long1024": (1, 1024, 0), "long2048": (1, 2048, 0),
}


class Case:
    def __init__(self, name: str, heads: int, kv_heads: int, head_dim: int, seed: int = 0):
        n_seq, new, cached = CASES[name]
        gen = torch.Generator().manual_seed(seed)
        self.name, self.lens, self.cached = name, [new] * n_seq, cached
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        tokens = n_seq * new
        self.q = torch.randn(tokens, heads, head_dim, generator=gen)
        self.k = torch.randn(tokens, kv_heads, head_dim, generator=gen)
        self.v = torch.randn(tokens, kv_heads, head_dim, generator=gen)
        prefix_pages = cached // PAGE
        systems = 3  # sequences share one of 3 prefixes, as the workload's system prompts
        pool = torch.randn(systems * prefix_pages + 1, 2, 2, PAGE, kv_heads, head_dim, generator=gen)
        self.k_cache, self.v_cache = pool[:, 0, 0], pool[:, 0, 1]  # strided, as PagePool's views
        self.prefixes = [torch.arange(prefix_pages, dtype=torch.int64) + (s % systems) * prefix_pages
                         for s in range(n_seq)]
        self.starts = torch.tensor([new * s for s in range(n_seq + 1)], dtype=torch.int64)
        self.flat = torch.cat(self.prefixes)
        self.prefix_starts = torch.tensor([prefix_pages * s for s in range(n_seq + 1)], dtype=torch.int64)
        self.flops = sum(4 * heads * head_dim * (cached + i + 1) for i in range(new)) * n_seq

    def sdpa(self) -> torch.Tensor:
        group = self.heads // self.kv_heads
        out = torch.empty_like(self.q)
        for s, new in enumerate(self.lens):
            a, b = int(self.starts[s]), int(self.starts[s + 1])
            ks, vs = self.k[a:b], self.v[a:b]
            if self.cached:
                pages = self.prefixes[s]
                ks = torch.cat([self.k_cache[pages].reshape(self.cached, *ks.shape[1:]), ks])
                vs = torch.cat([self.v_cache[pages].reshape(self.cached, *vs.shape[1:]), vs])
            mask = None
            if self.cached:
                mask = torch.arange(self.cached + new)[None, :] <= torch.arange(new)[:, None] + self.cached
            out[a:b] = F.scaled_dot_product_attention(
                self.q[a:b].transpose(0, 1), ks.transpose(0, 1).repeat_interleave(group, dim=0),
                vs.transpose(0, 1).repeat_interleave(group, dim=0), attn_mask=mask,
                is_causal=mask is None).transpose(0, 1)
        return out

    def cpp(self, vectorized: bool) -> torch.Tensor:
        out = torch.empty_like(self.q)
        prefix = (self.k_cache, self.v_cache, self.flat, self.prefix_starts) if self.cached else ()
        cpu_extension.extension().causal_prefill(self.q, self.k, self.v, self.starts, self.head_dim ** -0.5, out,
                                                 vectorized, *prefix)
        return out


def measure(case: Case, reps: int) -> dict[str, list[float]]:
    contenders = {"sdpa": case.sdpa, "c++ plain": lambda: case.cpp(False), "c++ vector": lambda: case.cpp(True)}
    with torch.inference_mode():
        want = case.sdpa()
        for name, run in contenders.items():  # warm up, and every path gives SDPA's answer
            got = run()
            if not torch.allclose(got, want, atol=1e-4, rtol=1e-4):
                raise SystemExit(f"{case.name}: {name} differs from SDPA by {(got - want).abs().max():.2e}")
        times: dict[str, list[float]] = {name: [] for name in contenders}
        for _ in range(reps):
            for name, run in contenders.items():
                t = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - t)
    return times


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--shape", choices=sorted(SHAPES), default="copy")
    p.add_argument("--cases", nargs="+", choices=sorted(CASES), default=list(CASES))
    args = p.parse_args(argv)
    ext = cpu_extension.extension()
    if ext is None:
        print(f"the C++ module is not built here: {cpu_extension.build_failure() or 'PAGEWARDEN_CPU_KERNELS'}")
        return 1
    heads, kv_heads, head_dim = SHAPES[args.shape]
    print(f"vector ISA {ext.vector_isa() or 'none'}, shape {args.shape} ({heads} heads over {kv_heads}, "
          f"d {head_dim}), {args.reps} reps, torch {torch.__version__}")
    print(f"{'case':10s} {'threads':>7s} {'contender':12s} {'best ms':>9s} {'median':>9s} {'GFLOP/s':>8s} "
          f"{'SDPA / this':>11s}")
    for name in args.cases:
        case = Case(name, heads, kv_heads, head_dim)
        for threads in args.threads:
            torch.set_num_threads(threads)
            times = measure(case, args.reps)
            sdpa = min(times["sdpa"])
            for contender, ts in times.items():
                best = min(ts)
                print(f"{name:10s} {threads:7d} {contender:12s} {best * 1e3:9.2f} {statistics.median(ts) * 1e3:9.2f} "
                      f"{case.flops / best / 1e9:8.1f} {sdpa / best:10.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
