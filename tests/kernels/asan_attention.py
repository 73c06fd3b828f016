"""The CPU attention (csrc/attention_cpu.cpp) built with AddressSanitizer, run over shapes
that put every edge of a buffer where a stray read or write lands outside it.

A read past head_dim or a score written past a row's end mostly lands in the next head's
data, where no accuracy test sees it. Here K, V, q and out are each an allocation of their
own whose last row is read, so a read past head_dim there leaves the allocation. The score
buffers are std::vectors annotated by _GLIBCXX_SANITIZE_VECTOR; a score written past the
last head's end leaves them where they are sized exactly: decode with page_size 1 (its
buffer holds every slot of the row's pages) and prefill's last query of each block of 16.

What this cannot see: a slip that stays inside one buffer (K's row g + 1 read for row g, a
score of head g written into head g + 1's), and, on AVX-512, the masked loads and stores,
which GCC's AddressSanitizer may not instrument (not checked: no AVX-512 machine here).

Run by tests/kernels/test_kernels_asan.py in a process started with libasan preloaded:
    python -m tests.kernels.asan_attention BUILD_DIR
Prints "checked N calls" and exits 0 when nothing was reported (ASan stops the process on
the first report, with its own exit status).
"""

from __future__ import annotations

import itertools
import os
import sys

import torch

from kernels import cpu_extension

SANITIZE = ("-fsanitize=address", "-fno-omit-frame-pointer", "-D_GLIBCXX_SANITIZE_VECTOR")
HEAD_DIMS = (8, 16, 24, 36, 40, 64, 128)  # one vector, AVX2-only multiples, neither, the models'
GROUPS = (1, 2, 3, 4, 5, 7, 8)            # every mix of 4/2/1 heads per V load and pairs per K load
LENGTHS = (1, 2, 7, 8, 9, 15, 16, 17, 33)  # every tail width of 8 and 16
PAGE_SIZES = (1, 4)                       # 1: decode's score buffer is exactly the row's
# prefill after a cached prefix: head_dims that take the 2-vector step of the V sum, more query
# heads than a score tile's 12 rows, and a sequence over one job of 64 query tokens
PREFIX_CASES = tuple(itertools.product((16, 48, 96), (1, 12), (1, 17, 130)))


def build(directory: str):
    # the compiler must not run under the preloaded runtime: only this process is sanitized
    os.environ.pop("LD_PRELOAD", None)
    return cpu_extension.compile_module("pagewarden_cpu_kernels_asan", cflags=cpu_extension.CFLAGS + SANITIZE,
                                        ldflags=cpu_extension.LDFLAGS + ("-fsanitize=address",), build_directory=directory)


def decode(ext, gen, n: int, group: int, head_dim: int, page_size: int, vectorized: bool) -> tuple[int, int]:
    """Two rows; the second ends on the last slot of the pool's last page, last KV head.
    Returns the call's rows on each path, (plain, vector)."""
    kv_heads = 2
    pages_per_row = -(-n // page_size)
    num_pages = 2 * pages_per_row
    k = torch.randn(num_pages, page_size, kv_heads, head_dim, generator=gen)
    v = torch.randn(num_pages, page_size, kv_heads, head_dim, generator=gen)
    q = torch.randn(2, kv_heads * group, head_dim, generator=gen)
    pages = torch.arange(num_pages, dtype=torch.int64).view(2, pages_per_row)
    blocked = torch.ones(2, pages_per_row * page_size, dtype=torch.bool)
    blocked[0, :n] = False
    blocked[1, pages_per_row * page_size - n:] = False  # the row's last n slots: the pool's end
    out = torch.empty_like(q)
    rows = ext.paged_decode(q, k, v, pages, blocked, head_dim ** -0.5, out, vectorized)
    assert out.isfinite().all()
    return rows


def prefill(ext, gen, n: int, group: int, head_dim: int, vectorized: bool) -> tuple[int, int]:
    """Three sequences, the last ending on the buffers' last row; returns the call's rows, (plain, vector)."""
    kv_heads = 2
    lens = (n, 1, n)
    tokens = sum(lens)
    q = torch.randn(tokens, kv_heads * group, head_dim, generator=gen)
    k = torch.randn(tokens, kv_heads, head_dim, generator=gen)
    v = torch.randn(tokens, kv_heads, head_dim, generator=gen)
    starts = torch.tensor([0, n, n + 1, tokens], dtype=torch.int64)
    out = torch.empty_like(q)
    rows = ext.causal_prefill(q, k, v, starts, head_dim ** -0.5, out, vectorized)
    assert out.isfinite().all()
    return rows


def prefix_prefill(ext, gen, head_dim: int, group: int, n: int, vectorized: bool) -> tuple[int, int]:
    """Three sequences after cached prefixes read from a pool of their own allocation, the last
    page of which ends the allocation: the first and the last sequence read it."""
    kv_heads, pages = 2, 3
    lens = (n, 1, n)
    tokens = sum(lens)
    q = torch.randn(tokens, kv_heads * group, head_dim, generator=gen)
    k = torch.randn(tokens, kv_heads, head_dim, generator=gen)
    v = torch.randn(tokens, kv_heads, head_dim, generator=gen)
    k_cache = torch.randn(pages, 4, kv_heads, head_dim, generator=gen)
    v_cache = torch.randn(pages, 4, kv_heads, head_dim, generator=gen)
    prefix_pages = torch.tensor([pages - 1, 0, pages - 1], dtype=torch.int64)
    prefix_starts = torch.tensor([0, 1, 1, 3], dtype=torch.int64)
    starts = torch.tensor([0, n, n + 1, tokens], dtype=torch.int64)
    out = torch.empty_like(q)
    rows = ext.causal_prefill(q, k, v, starts, head_dim ** -0.5, out, vectorized, k_cache, v_cache, prefix_pages,
                              prefix_starts)
    assert out.isfinite().all()
    return rows


def calls() -> int:
    """How many kernel calls main() makes."""
    return len(HEAD_DIMS) * len(GROUPS) * len(LENGTHS) * 2 * (len(PAGE_SIZES) + 1) + len(PREFIX_CASES) * 2


def main(directory: str) -> int:
    ext = build(directory)
    gen = torch.Generator().manual_seed(0)
    made = 0
    rows = {"plain": 0, "vector": 0}
    for head_dim, group, n, vectorized in itertools.product(HEAD_DIMS, GROUPS, LENGTHS, (True, False)):
        answers = [decode(ext, gen, n, group, head_dim, page_size, vectorized) for page_size in PAGE_SIZES]
        answers.append(prefill(ext, gen, n, group, head_dim, vectorized))
        on_vectors = vectorized and ext.vectorized_for(head_dim)
        for plain, vector in answers:  # each call ran on one path, the one its flags pick
            assert (plain, vector) == ((0, vector) if on_vectors else (plain, 0)), (head_dim, vectorized, plain, vector)
            rows["plain"] += plain
            rows["vector"] += vector
        made += len(answers)
    for (head_dim, group, n), vectorized in itertools.product(PREFIX_CASES, (True, False)):
        plain, vector = prefix_prefill(ext, gen, head_dim, group, n, vectorized)
        on_vectors = vectorized and ext.vectorized_for(head_dim)
        assert (plain, vector) == ((0, vector) if on_vectors else (plain, 0)), (head_dim, vectorized, plain, vector)
        rows["plain"] += plain
        rows["vector"] += vector
        made += 1
    if ext.vector_isa():  # the sanitized build must have run its vector path, not only the loops
        assert rows["vector"] > 0 and rows["plain"] > 0, rows
    print(f"checked {made} calls on {ext.vector_isa() or 'plain loops'}: {rows['vector']} vector rows, "
          f"{rows['plain']} plain rows")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
