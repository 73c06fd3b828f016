"""Allocate + free every page of a 1,048,576-page pool in batches; report pages/s.

    python bench/kv_alloc.py [--pages N] [--batches 16,256,4096] [--policies none,zero]

Also runs a 65,536-page pool side by side: if allocation is O(1) per page, pages/s does
not depend on the pool's size (the printed ratio stays near 1.0).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from engine.kv.page_pool import PageLayout, PagePool  # noqa: E402

# Metadata-heavy, storage-light pages: what is measured is the allocator, not memset.
LAYOUT = PageLayout(num_layers=1, num_kv_heads=1, head_dim=1, page_size=16, dtype=torch.float32)


def cycle(pool: PagePool, batch: int) -> float:
    """Allocate the whole pool in `batch`-page grants, then free them; seconds."""
    start = time.perf_counter()
    grants = []
    slot = 1
    while pool.free_pages:
        n = min(batch, pool.free_pages)
        grants.append((slot, pool.allocate(slot, n).pages))
        slot += 1
    for owner, pages in grants:
        pool.free(owner, pages)
    return time.perf_counter() - start


def measure(pages: int, batch: int, policy: str, reps: int) -> float:
    pool = PagePool("bench", pages, LAYOUT, scrub_policy=policy)
    cycle(pool, batch)  # warm-up
    best = min(cycle(pool, batch) for _ in range(reps))
    return pages / best  # each page allocated once and freed once


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", type=int, default=1_048_576)
    parser.add_argument("--small-pages", type=int, default=65_536)
    parser.add_argument("--batches", default="16,256,4096")
    parser.add_argument("--policies", default="none,zero")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    print(f"# kv_alloc: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}")
    print(f"| scrub | pages/grant | pool {args.pages:,}: pages/s | pool {args.small_pages:,}: pages/s | big/small |")
    print("|---|---:|---:|---:|---:|")
    for policy in args.policies.split(","):
        for batch in map(int, args.batches.split(",")):
            big = measure(args.pages, batch, policy, args.reps)
            small = measure(args.small_pages, batch, policy, args.reps)
            print(f"| {policy} | {batch:,} | {big:,.0f} | {small:,.0f} | {big / small:.2f} |")
    print("pages/s = pages allocated and freed again per second; O(1) per page keeps big/small near 1.00")


if __name__ == "__main__":
    main()
