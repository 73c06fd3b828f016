"""The C++ prefill over a cached prefix (causal_prefill with prefix pages), against a float64
oracle, the SDPA path it replaces, and its argument checks.

A sequence of the batch may start after whole pages of the pool (the prefix cache): its
queries attend those pages' K/V in place, then their own suffix causally. The pages are
strided views of one pool tensor, as PagePool.k_cache(layer) gives them.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels import cpu_extension
from tests.kernels.test_kernels_cpu import PATHS, assert_close, fused_qkv

PAGE = 16
pytestmark = pytest.mark.usefixtures("built")  # tests/kernels/conftest.py


def pool_views(gen, pages: int, kv_heads: int, head_dim: int, layers: int = 2):
    """k_cache, v_cache of layer 1: [pages, PAGE, kv_heads, head_dim], strided over pages."""
    data = torch.randn(pages, layers, 2, PAGE, kv_heads, head_dim, generator=gen)
    return data[:, 1, 0], data[:, 1, 1]


def prefix_oracle(q, k, v, lens, k_cache, v_cache, prefixes):
    """float64, sequence by sequence: suffix query i attends every prefix token, then suffix
    tokens 0..i."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    group, start = q.shape[1] // k.shape[1], 0
    for n, pages in zip(lens, prefixes):
        cached = len(pages) * PAGE
        pk = k_cache[pages].reshape(cached, *k.shape[1:]).double()
        pv = v_cache[pages].reshape(cached, *v.shape[1:]).double()
        qs = q[start:start + n].double()
        ks = torch.cat([pk, k[start:start + n].double()]).repeat_interleave(group, dim=1)
        vs = torch.cat([pv, v[start:start + n].double()]).repeat_interleave(group, dim=1)
        scores = torch.einsum("thd,shd->hts", qs, ks) * q.shape[-1] ** -0.5
        hidden = torch.arange(cached + n)[None, :] > torch.arange(n)[:, None] + cached
        scores = scores.masked_fill(hidden, float("-inf"))
        out[start:start + n] = torch.einsum("hts,shd->thd", torch.softmax(scores, dim=-1), vs)
        start += n
    return out


def flat(prefixes):
    pages = torch.tensor([p for pages in prefixes for p in pages], dtype=torch.int64)
    starts = torch.tensor(np.cumsum([0] + [len(p) for p in prefixes]), dtype=torch.int64)
    return pages, starts


@pytest.mark.parametrize("vectorized", PATHS)
@pytest.mark.parametrize("kv_heads,group,head_dim", [(1, 8, 128), (3, 3, 64), (2, 1, 16), (1, 5, 40), (1, 7, 80),
                                                     (2, 3, 48)])
def test_prefix_prefill_matches_the_oracle(built, vectorized, kv_heads, group, head_dim):
    """Shapes that leave every remainder of the vector path: rows per tile (group 7, 3, 5),
    vectors of head_dim per pass (80 = 4 + 1, 48 = 2 + 1), keys past a tile of 32, and a
    sequence of 130 new tokens (more than one job of 64 and more than one pass of 16)."""
    gen = torch.Generator().manual_seed(head_dim + group)
    lens = [1, 17, 5, 130, 3]
    # shared and private prefixes, one sequence without, pages out of order and repeated
    prefixes = [[7, 2, 9], [], [7, 2], [30, 31, 4, 5], [11]]
    q, k, v = fused_qkv(gen, sum(lens), kv_heads * group, kv_heads, head_dim)
    k_cache, v_cache = pool_views(gen, 32, kv_heads, head_dim)
    starts = torch.tensor(np.cumsum([0] + lens), dtype=torch.int64)
    pages, prefix_starts = flat(prefixes)
    out = torch.full(q.shape, float("nan"))
    rows = built.causal_prefill(q, k, v, starts, head_dim ** -0.5, out, vectorized,
                                k_cache, v_cache, pages, prefix_starts)
    assert sum(rows) == sum(lens) * kv_heads
    assert_close(out, prefix_oracle(q, k, v, lens, k_cache, v_cache, prefixes), 1e-5)


def test_no_prefix_pages_is_the_plain_causal_prefill(built):
    gen = torch.Generator().manual_seed(4)
    lens = [9, 20]
    q, k, v = fused_qkv(gen, sum(lens), 8, 1, 128)
    k_cache, v_cache = pool_views(gen, 4, 1, 128)
    starts = torch.tensor([0, 9, 29], dtype=torch.int64)
    plain, empty = torch.empty(q.shape), torch.empty(q.shape)
    built.causal_prefill(q, k, v, starts, 0.1, plain, True)
    built.causal_prefill(q, k, v, starts, 0.1, empty, True, k_cache, v_cache,
                         torch.empty(0, dtype=torch.int64), torch.zeros(3, dtype=torch.int64))
    assert torch.equal(plain, empty)


def test_prefix_arguments_that_do_not_fit_are_named(built):
    gen = torch.Generator().manual_seed(5)
    q, k, v = fused_qkv(gen, 10, 4, 2, 16)
    k_cache, v_cache = pool_views(gen, 8, 2, 16)
    starts, out = torch.tensor([0, 4, 10]), torch.empty(q.shape)

    def call(pages, prefix_starts, kc=k_cache, vc=v_cache):
        built.causal_prefill(q, k, v, starts, 1.0, out, True, kc, vc, torch.tensor(pages, dtype=torch.int64),
                             torch.tensor(prefix_starts, dtype=torch.int64))

    with pytest.raises(RuntimeError, match="prefix page 8 is outside the pool of 8 pages"):
        call([1, 8], [0, 1, 2])
    with pytest.raises(RuntimeError, match="prefix page -1 is outside"):
        call([-1], [0, 1, 1])
    with pytest.raises(RuntimeError, match=r"prefix_starts must be \[3\]"):
        call([1], [0, 1])
    with pytest.raises(RuntimeError, match="prefix_starts must run from 0 to 2"):
        call([1, 2], [0, 1, 1])
    with pytest.raises(RuntimeError, match="prefix_starts must not decrease"):
        call([1, 2], [0, 3, 2])
    with pytest.raises(RuntimeError, match="must have 2 kv heads of head_dim 16"):
        call([1], [0, 1, 1], k_cache[:, :, :1], v_cache[:, :, :1])
    with pytest.raises(RuntimeError, match="needs k_cache, v_cache, prefix_pages and prefix_starts"):
        built.causal_prefill(q, k, v, starts, 1.0, out, True, k_cache, v_cache, torch.tensor([1]))


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "sdpa"])
def test_the_engine_attends_the_prefix_in_place_or_gathered_alike(monkeypatch, kernel):
    """PagedPrefixPrefillAttention over a real pool: the kernel under inference, the
    gather-and-SDPA path where the module is not built; the oracle's answer either way, and
    the suffix K/V are stored in the pool."""
    from engine.attention import PagedPrefixPrefillAttention
    from engine.kv.page_pool import PageLayout, PagePool
    from kernels.backend import select_kernels

    if not kernel:
        monkeypatch.setattr(cpu_extension, "extension", lambda: None)
    gen = torch.Generator().manual_seed(6)
    pool = PagePool("decode", 16, PageLayout(2, 1, 128, PAGE, torch.float32))
    pool.data.copy_(torch.randn(pool.data.shape, generator=gen))
    lens, prefixes = [12, 30], [[3, 1], [5]]
    suffix_slots = np.concatenate([10 * PAGE + np.arange(12), 12 * PAGE + np.arange(30)])
    q, k, v = fused_qkv(gen, sum(lens), 8, 1, 128)
    want = prefix_oracle(q, k, v, lens, pool.k_cache(1), pool.v_cache(1), prefixes)
    ctx = PagedPrefixPrefillAttention(pool, select_kernels("torch", "cpu"), lens, torch.from_numpy(suffix_slots),
                                      torch.full((sum(lens),), 5, dtype=torch.int64),
                                      [torch.tensor(p, dtype=torch.int64) for p in prefixes])
    with torch.inference_mode():
        got = ctx.attend(1, q, k, v)
    assert_close(got, want, 1e-5)
    stored = pool.k_cache(1).reshape(-1, 1, 128)[torch.from_numpy(suffix_slots)]
    assert torch.equal(stored, k)
