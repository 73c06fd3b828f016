"""The KV block digest's bytes per second on the CPU against a plain copy of the same blocks.

    python bench/block_digest.py [--blocks 2048] [--rounds 15] [--threads N] [--quick]

The copy (torch.index_select of the same blocks into a buffer allocated once) is the
physical limit the digest is held to: it reads what the digest reads and writes as much
again. Both are timed in interleaved rounds in one run, the median round reported, over
blocks scattered at random in a pool larger than the caches, for the layouts a KV
connector digests: one layer's K (vLLM's FlashAttention cache, kv[0]) and K and V of a block
as one row (kv.permute(1, 2, 0, 3, 4)). GB/s counts the bytes of the rows digested.
The GPU figure is bench/gpu_kernels.py's digest table.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from kernels import block_digest_ref  # noqa: E402
from kernels.block_digest import block_digest, digest_backend  # noqa: E402

BLOCK_SIZE, KV_HEADS, HEAD_DIM, DTYPE = 16, 8, 128, torch.bfloat16


def timed(fn) -> float:
    begin = time.perf_counter()
    fn()
    return time.perf_counter() - begin


def measure(name: str, view: torch.Tensor, ids: torch.Tensor, valid: torch.Tensor, rounds: int) -> dict:
    """Digest and copy of view[ids] (valid rows each), interleaved; medians in seconds."""
    buffer = torch.empty((ids.numel(), *view.shape[1:]), dtype=view.dtype)
    want = block_digest_ref.block_digest(view, ids[:64], valid[:64]).tolist()
    if block_digest(view, ids[:64], valid[:64]).tolist() != want:
        raise SystemExit(f"{name}: the digest differs from the torch reference")
    torch.index_select(view, 0, ids, out=buffer)  # warm-up: the buffer's pages faulted in before timing
    block_digest(view, ids, valid)
    digest_s, copy_s = [], []
    for _ in range(rounds):
        digest_s.append(timed(lambda: block_digest(view, ids, valid)))
        copy_s.append(timed(lambda: torch.index_select(view, 0, ids, out=buffer)))
    row_bytes = view[0, 0].numel() * view.element_size()
    counted = int(valid.sum()) * row_bytes
    copied = ids.numel() * view.shape[1] * row_bytes
    digest_gbps = counted / statistics.median(digest_s) / 1e9
    copy_gbps = copied / statistics.median(copy_s) / 1e9
    return {"layout": name, "blocks": ids.numel(), "MB": counted / 1e6, "digest": digest_gbps, "copy": copy_gbps}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=2048, help="blocks digested per call")
    parser.add_argument("--pool", type=int, default=8192, help="blocks in the pool (>= --blocks)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, help="torch (and C++ kernel) threads; default: torch's")
    parser.add_argument("--quick", action="store_true", help="a small pool and few rounds: checks the script")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.blocks, args.pool, args.rounds = 64, 256, 3
    seed = int.from_bytes(os.urandom(4), "little")
    gen = torch.Generator().manual_seed(seed)
    # vLLM's FlashAttention layout for one layer: [2 (K, V), blocks, block_size, heads, dim]
    kv = torch.randn(2, args.pool, BLOCK_SIZE, KV_HEADS, HEAD_DIM, generator=gen).to(DTYPE)
    ids = torch.randperm(args.pool, generator=gen)[: args.blocks]
    full = torch.full((args.blocks,), BLOCK_SIZE, dtype=torch.int32)
    ragged = torch.randint(1, BLOCK_SIZE + 1, (args.blocks,), generator=gen, dtype=torch.int32)
    print(f"# block_digest: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"{torch.get_num_threads()} torch threads, torch {torch.__version__}, digest on {digest_backend('cpu')}")
    print(f"# pool {args.pool} blocks x {BLOCK_SIZE} rows x {KV_HEADS} heads x {HEAD_DIM} {str(DTYPE)[6:]}, "
          f"K and V {2 * kv[0].numel() * kv.element_size() / 1e6:.0f} MB; seed {seed}; median of {args.rounds} rounds\n")
    rows = [
        measure("K (kv[0]), full blocks", kv[0], ids, full, args.rounds),
        measure("K (kv[0]), ragged valid rows", kv[0], ids, ragged, args.rounds),
        measure("K+V (kv.permute(1, 2, 0, 3, 4))", kv.permute(1, 2, 0, 3, 4), ids, full, args.rounds),
    ]
    print("| layout | blocks | MB digested | digest GB/s | copy GB/s | digest / copy |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['layout']} | {r['blocks']} | {r['MB']:.0f} | {r['digest']:.2f} | {r['copy']:.2f} "
              f"| {r['digest'] / r['copy']:.2f} |")
    print("\ncopy GB/s counts the blocks' bytes once (it reads them and writes as many); with ragged valid "
          "rows the copy moves whole blocks and the digest only the counted rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
