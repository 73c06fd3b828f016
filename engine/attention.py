"""Attention contexts: how one forward pass attends, with or without the paged KV pool.

- DenseCausalAttention: every packed sequence attends causally to its own fresh K/V.
  No cache; the reference the paged path is checked against.
- PagedPrefillAttention: stores the fresh K/V into the request's pages (stamping writer
  tags), then attends like the dense reference.
- PagedDecodeAttention: stores each sequence's new K/V, then reads its context from the
  pool through the paged kernel, which masks and counts pages with a foreign writer (I1).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from kernels.backend import KernelSet


class DenseCausalAttention:
    def __init__(self, seq_lens: list[int]):
        self.bounds = []
        start = 0
        for n in seq_lens:
            self.bounds.append((start, start + n))
            start += n

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        group = q.shape[1] // k.shape[1]
        out = torch.empty_like(q)
        for start, end in self.bounds:
            qs = q[start:end].transpose(0, 1)
            ks = k[start:end].transpose(0, 1).repeat_interleave(group, dim=0)
            vs = v[start:end].transpose(0, 1).repeat_interleave(group, dim=0)
            out[start:end] = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True).transpose(0, 1)
        return out


class PagedPrefillAttention(DenseCausalAttention):
    def __init__(self, pool, kernels: KernelSet, seq_lens: list[int], slot_mapping, writer_tags):
        super().__init__(seq_lens)
        self.pool, self.kernels = pool, kernels
        self.slot_mapping, self.writer_tags = slot_mapping, writer_tags

    def attend(self, layer, q, k, v):
        self.kernels.store_kv(
            self.pool.k_cache(layer), self.pool.v_cache(layer), k, v,
            self.slot_mapping, self.writer_tags, self.pool.writer, self.pool.filled,
        )
        return super().attend(layer, q, k, v)


class PagedDecodeAttention:
    """One new token per sequence; q is [B, H, D]."""

    def __init__(
        self, pool, kernels: KernelSet, *, block_table, expected_tags, seq_lens,
        slot_mapping, writer_tags, check_tags: bool,
    ):
        self.pool, self.kernels = pool, kernels
        self.block_table, self.expected_tags, self.seq_lens = block_table, expected_tags, seq_lens
        self.slot_mapping, self.writer_tags = slot_mapping, writer_tags
        self.check_tags = check_tags
        self.violations = torch.zeros(len(seq_lens), dtype=torch.int32, device=pool.device)
        self.out: torch.Tensor | None = None

    def attend(self, layer, q, k, v):
        pool = self.pool
        k_cache, v_cache = pool.k_cache(layer), pool.v_cache(layer)
        self.kernels.store_kv(
            k_cache, v_cache, k, v, self.slot_mapping, self.writer_tags, pool.writer, pool.filled
        )
        if self.out is None:
            self.out = torch.empty_like(q)
        # Every layer sees the same tags, so each call recounts the same violations.
        out, _ = self.kernels.paged_decode_attention(
            q, k_cache, v_cache, self.block_table, self.expected_tags, self.seq_lens,
            pool.writer, pool.filled, scale=q.shape[-1] ** -0.5, check_tags=self.check_tags,
            out=self.out, violations=self.violations,
        )
        return out
