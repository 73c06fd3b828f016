"""Decode-attention bandwidth on one GPU: the Triton paged kernel (tag check on and off)
against device copy bandwidth and a dense torch baseline; and the KV block digest's bytes
per second against a plain copy of the same blocks (bench/block_digest.py is the CPU's).

    python bench/gpu_kernels.py [--json results.json]   # on a CUDA machine, < 5 minutes
    python bench/gpu_kernels.py --smoke                 # tiny shapes, CPU, Triton interpreter

Goals printed with the results: >= 80% of copy bandwidth at batch >= 16 and context >= 4k,
the tag check costing at most 5% (check on / check off <= 1.05), and the digest reading at
>= 80% of copy bandwidth at >= 16k blocks.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

COPY_GOAL = 0.80
CHECK_OVERHEAD_GOAL = 1.05
DIGEST_GOAL = 0.80  # digest bytes read / device copy bandwidth (read + write), at >= DIGEST_GOAL_BLOCKS
DIGEST_GOAL_BLOCKS = 16384


@dataclass(frozen=True)
class Setup:
    device: str
    dtype: torch.dtype
    heads: int
    kv_heads: int
    head_dim: int
    page_size: int
    num_layers: int  # > 1 so per-layer cache views are strided, as in the engine
    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    copy_bytes: int
    rounds: int  # timed rounds per measurement; the median round is reported
    calls: int  # back-to-back calls per round
    partition_size: int
    tolerance: float
    digest_blocks: tuple[int, ...] = (1024, 16384, 65536)


GPU = Setup("cuda", torch.bfloat16, 32, 8, 128, 16, 2, (1, 16, 64), (1024, 4096, 16384),
            copy_bytes=2 << 30, rounds=7, calls=20, partition_size=512, tolerance=3e-2)
SMOKE = Setup("cpu", torch.float32, 4, 2, 16, 4, 2, (1, 2), (16, 40),
              copy_bytes=1 << 20, rounds=1, calls=2, partition_size=16, tolerance=1e-4,
              digest_blocks=(16, 64))


@dataclass
class Row:
    batch: int
    context: int
    on_us: float
    off_us: float
    dense_us: float
    on_gbps: float
    off_gbps: float
    dense_gbps: float
    copy_fraction: float
    on_off_ratio: float
    max_rel_err: float


def time_us(fn, setup: Setup) -> list[float]:
    """Per-call microseconds of `fn`, one number per round (each round: `calls` back-to-back calls)."""
    fn()  # warm-up (and compile)
    results = []
    for _ in range(setup.rounds):
        if setup.device == "cuda":
            # let the CPU queue the whole round first, so launch overhead does not count
            torch.cuda._sleep(20_000_000)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(setup.calls):
                fn()
            end.record()
            end.synchronize()
            results.append(start.elapsed_time(end) * 1e3 / setup.calls)
        else:
            begin = time.perf_counter()
            for _ in range(setup.calls):
                fn()
            results.append((time.perf_counter() - begin) * 1e6 / setup.calls)
    return results


def copy_bandwidth_gbps(setup: Setup) -> float:
    """Device-to-device copy bandwidth, counting bytes read plus bytes written."""
    src = torch.empty(setup.copy_bytes // 2, dtype=torch.bfloat16, device=setup.device).uniform_()
    dst = torch.empty_like(src)
    us = statistics.median(time_us(lambda: dst.copy_(src), setup))
    del src, dst
    return 2 * setup.copy_bytes / us / 1e3


def make_pool(setup: Setup):
    """One page-major pool big enough for the largest shape; shapes draw pages from it at random."""
    pages = max(setup.batches) * max(setup.contexts) // setup.page_size + 64
    data = torch.empty(pages, setup.num_layers, 2, setup.page_size, setup.kv_heads, setup.head_dim,
                       dtype=setup.dtype, device=setup.device).normal_()
    token_writer = torch.full((pages, setup.page_size), -1, dtype=torch.int64, device=setup.device)
    return data, token_writer


def make_batch(setup: Setup, data, token_writer, batch: int, context: int):
    """Block tables over randomly scattered pages, each tagged by its sequence as the writer."""
    per_seq = math.ceil(context / setup.page_size)
    pages = torch.randperm(data.shape[0], device=setup.device)[: batch * per_seq].view(batch, per_seq)
    tags = ((torch.arange(batch, device=setup.device, dtype=torch.int64) + 1) << 32)[:, None].expand(batch, per_seq)
    token_writer.fill_(-1)
    token_writer[pages] = tags[:, :, None]  # every slot of every page written by its sequence
    q = torch.randn(batch, setup.heads, setup.head_dim, dtype=setup.dtype, device=setup.device)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=setup.device)
    return q, pages.to(torch.int32), tags.contiguous(), seq_lens


def dense_attention(q, k_dense, v_dense, scale):
    """The torch baseline: contiguous [B, Hkv, T, D] K/V, the G query heads of a kv head as G queries."""
    batch, heads, dim = q.shape
    kv_heads = k_dense.shape[1]
    qg = q.view(batch, kv_heads, heads // kv_heads, dim)
    out = torch.nn.functional.scaled_dot_product_attention(qg, k_dense, v_dense, scale=scale)
    return out.reshape(batch, heads, dim)


def rel_err(actual, expected) -> float:
    return ((actual.float() - expected.float()).abs().max() / expected.float().abs().max()).item()


def measure_shape(setup, kernels, data, token_writer, copy_gbps, batch, context) -> Row:
    triton_attention, reference_attention = kernels
    k_cache, v_cache = data[:, 0, 0], data[:, 0, 1]
    q, table, tags, seq_lens = make_batch(setup, data, token_writer, batch, context)
    scale = setup.head_dim ** -0.5
    args = (q, k_cache, v_cache, table, tags, seq_lens, token_writer)
    out = torch.empty_like(q)
    violations = torch.zeros(batch, 2, dtype=torch.int32, device=setup.device)
    k_dense = k_cache[table.long()].flatten(1, 2).transpose(1, 2).contiguous()
    v_dense = v_cache[table.long()].flatten(1, 2).transpose(1, 2).contiguous()

    def run(check):
        return triton_attention(*args, scale=scale, check_tags=check, out=out, violations=violations,
                                partition_size=setup.partition_size)

    want, _ = reference_attention(*args, scale=scale)
    got, got_violations = run(True)
    err, seen = rel_err(got, want), got_violations.flatten().tolist()  # both buffers are reused by run(False)
    err = max(err, rel_err(run(False)[0], want), rel_err(dense_attention(q, k_dense, v_dense, scale), want))
    if err > setup.tolerance or any(seen):
        raise SystemExit(f"batch {batch} context {context}: output differs from the torch reference "
                         f"(max relative error {err:.3g}, violations {seen})")
    on, off = [], []
    for _ in range(setup.rounds):  # interleaved, so drift hits both variants alike
        on += time_us(lambda: run(True), replace(setup, rounds=1))
        off += time_us(lambda: run(False), replace(setup, rounds=1))
    dense_us = statistics.median(time_us(lambda: dense_attention(q, k_dense, v_dense, scale), setup))
    on_us, off_us = statistics.median(on), statistics.median(off)

    elem = q.element_size()
    kv_bytes = 2 * batch * context * setup.kv_heads * setup.head_dim * elem
    io_bytes = 2 * q.numel() * elem + seq_lens.numel() * 4  # q in, out back
    table_bytes = table.numel() * 4
    tag_bytes = table.numel() * (8 + 8 + 4)  # expected tag, writer tag, filled per page
    return Row(
        batch, context, on_us, off_us, dense_us,
        on_gbps=(kv_bytes + io_bytes + table_bytes + tag_bytes) / on_us / 1e3,
        off_gbps=(kv_bytes + io_bytes + table_bytes) / off_us / 1e3,
        dense_gbps=(kv_bytes + io_bytes) / dense_us / 1e3,
        copy_fraction=(kv_bytes + io_bytes + table_bytes + tag_bytes) / on_us / 1e3 / copy_gbps,
        on_off_ratio=on_us / off_us, max_rel_err=err,
    )


@dataclass
class DigestRow:
    layout: str
    blocks: int
    digest_us: float
    copy_us: float
    digest_gbps: float  # bytes of the blocks digested (read once) per second
    copy_gbps: float  # bytes of the same blocks copied by index_select (read and written) per second
    copy_fraction: float  # digest_gbps / device copy bandwidth (read + write)


def digest_views(data) -> dict:
    """The views a KV connector digests: one layer's K, and K and V of a block as one row."""
    return {"K": data[:, 0, 0], "K+V": data[:, 0].transpose(1, 2)}


def measure_digest(setup, digest, data, copy_gbps, layout, blocks) -> DigestRow:
    """The Triton digest of `blocks` random pages of a view against index_select of the same
    pages into a buffer allocated once, interleaved; exits on any bit that differs from the
    torch reference."""
    from kernels import block_digest_ref

    view = digest_views(data)[layout]
    # the digest's entries come from the host, as a connector's block ids do (checked there,
    # sent without a sync); index_select's are on the device already
    ids = torch.randperm(view.shape[0])[:blocks]
    valid = torch.full((ids.numel(),), view.shape[1], dtype=torch.int32)
    device_ids = ids.to(setup.device)
    few = min(256, blocks)  # checked bit for bit on the CPU, over a copy of just these blocks
    want = block_digest_ref.block_digest(view.index_select(0, device_ids[:few]).cpu(), torch.arange(few),
                                         valid[:few]).tolist()
    if digest(view, ids[:few], valid[:few]).cpu().tolist() != want:
        raise SystemExit(f"digest of {layout} differs from the torch reference")
    buffer = torch.empty((ids.numel(), *view.shape[1:]), dtype=view.dtype, device=setup.device)
    digest_us, copy_us = [], []
    for _ in range(setup.rounds):  # interleaved, so drift hits both alike
        digest_us += time_us(lambda: digest(view, ids, valid), replace(setup, rounds=1))
        copy_us += time_us(lambda: torch.index_select(view, 0, device_ids, out=buffer), replace(setup, rounds=1))
    nbytes = ids.numel() * view[0].numel() * view.element_size()
    d_us, c_us = statistics.median(digest_us), statistics.median(copy_us)
    return DigestRow(layout, ids.numel(), d_us, c_us, nbytes / d_us / 1e3, nbytes / c_us / 1e3,
                     nbytes / d_us / 1e3 / copy_gbps)


def print_digest_report(rows) -> None:
    print("\nKV block digest (Triton), random pages of the pool, full blocks:\n")
    print("| view | blocks | digest us | copy us | digest GB/s | copy GB/s | digest / copy | % of device copy |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r.layout} | {r.blocks} | {r.digest_us:.1f} | {r.copy_us:.1f} | {r.digest_gbps:.1f} "
              f"| {r.copy_gbps:.1f} | {r.digest_gbps / r.copy_gbps:.2f} | {100 * r.copy_fraction:.1f}% |")
    big = [r.copy_fraction for r in rows if r.blocks >= DIGEST_GOAL_BLOCKS]
    if big:
        print(f"\nGoal: digest >= {DIGEST_GOAL:.0%} of device copy bandwidth at >= {DIGEST_GOAL_BLOCKS} blocks: "
              f"{_verdict(min(big) >= DIGEST_GOAL)} (worst {min(big):.1%})")
    print("note: copy GB/s counts the blocks' bytes once; the device copy bandwidth counts read + write")


def print_report(rows, copy_gbps, setup):
    print(f"device copy bandwidth (read + write): {copy_gbps:.1f} GB/s")
    print(f"dtype {str(setup.dtype).removeprefix('torch.')}, {setup.heads} query heads, {setup.kv_heads} kv "
          f"heads, head_dim {setup.head_dim}, page_size {setup.page_size}, pages scattered at random\n")
    print("| batch | context | check on us | check off us | on/off | on GB/s | % of copy "
          "| dense torch us | dense GB/s | max rel err |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r.batch} | {r.context} | {r.on_us:.1f} | {r.off_us:.1f} | {r.on_off_ratio:.3f} "
              f"| {r.on_gbps:.1f} | {100 * r.copy_fraction:.1f}% | {r.dense_us:.1f} | {r.dense_gbps:.1f} "
              f"| {r.max_rel_err:.2g} |")
    goals = goal_summary(rows)
    if "worst_copy_fraction" in goals:
        print(f"\nGoal: >= {COPY_GOAL:.0%} of copy bandwidth at batch >= 16 & context >= 4k: "
              f"{_verdict(goals['copy_goal_met'])} (worst {goals['worst_copy_fraction']:.1%})")
    print(f"Goal: check on vs off within {CHECK_OVERHEAD_GOAL - 1:.0%}: {_verdict(goals['check_goal_met'])} "
          f"(worst on/off {goals['worst_on_off']:.3f})")
    print("note: K/V bytes count once per call; shapes under ~50 MB of K/V may be served partly from L2")


def goal_summary(rows) -> dict:
    """The two goals: copy-bandwidth fraction at batch >= 16 & context >= 4k, check overhead everywhere."""
    goals = {"worst_on_off": max(r.on_off_ratio for r in rows)}
    goals["check_goal_met"] = goals["worst_on_off"] <= CHECK_OVERHEAD_GOAL
    big = [r.copy_fraction for r in rows if r.batch >= 16 and r.context >= 4096]
    if big:
        goals["worst_copy_fraction"] = min(big)
        goals["copy_goal_met"] = min(big) >= COPY_GOAL
    return goals


def _verdict(met: bool) -> str:
    return "PASS" if met else "FAIL"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on CPU under the Triton interpreter")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args(argv)
    setup = SMOKE if args.smoke else GPU
    if setup.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --smoke for the CPU interpreter check", file=sys.stderr)
        return 2
    if setup.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernel module is imported
    from kernels.block_digest_triton import block_digest as triton_digest
    from kernels.paged_attention_ref import paged_decode_attention as reference_attention
    from kernels.paged_attention_triton import paged_decode_attention as triton_attention

    seed = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    print(f"seed {seed}")
    copy_gbps = copy_bandwidth_gbps(setup)
    data, token_writer = make_pool(setup)
    rows = [
        measure_shape(setup, (triton_attention, reference_attention), data, token_writer, copy_gbps, b, c)
        for b in setup.batches for c in setup.contexts
    ]
    digest_rows = [measure_digest(setup, triton_digest, data, copy_gbps, layout, n)
                   for layout in digest_views(data) for n in setup.digest_blocks]
    if args.smoke:
        print("smoke run (CPU, Triton interpreter): checks the script end to end; timings mean nothing\n")
    print_report(rows, copy_gbps, setup)
    print_digest_report(digest_rows)
    if args.json:
        report = {"seed": seed, "copy_gbps": copy_gbps, "goals": goal_summary(rows), "rows": [asdict(r) for r in rows],
                  "digest_rows": [asdict(r) for r in digest_rows]}
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
