"""Attention contexts: how one forward pass attends, with or without the paged KV pool.

- DenseCausalAttention: every packed sequence attends causally to its own fresh K/V.
  No cache; the reference the paged path is checked against.
- PagedPrefillAttention: stores the fresh K/V into the request's pages (stamping writer
  tags), then attends like the dense reference.
- PagedDecodeAttention: stores each sequence's new K/V, then reads its context from the
  pool through the paged kernel, which masks and counts pages with a foreign writer (I1).
"""

from __future__ import annotations

import itertools

import torch
from torch.nn import functional as F

from kernels import cpu_extension
from kernels.backend import KernelSet


class DenseCausalAttention:
    # the C++ kernel re-reads each query's keys (O(n^2) reads); with its vector path it was
    # measured faster than SDPA up to 8,192 tokens a sequence (AVX-512: 1.5-3.5x; AVX2: 1.3-2.2x,
    # bench/RESULTS.md), SDPA beyond. Its plain loops are 5-7x slower than SDPA: where the build
    # has no vector path for the head_dim, prefill stays on SDPA
    CPU_KERNEL_MAX_TOKENS = 8192

    def __init__(self, seq_lens: list[int]):
        self.bounds = []
        start = 0
        for n in seq_lens:
            self.bounds.append((start, start + n))
            start += n
        self.starts = None  # [S + 1] int64 for the C++ kernel, made on first use
        self.longest = max(seq_lens, default=0)

    def _kernel_takes(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
        return (self.longest <= self.CPU_KERNEL_MAX_TOKENS and q.stride(2) == 1 and q.stride(1) == q.shape[2]
                and k.stride(2) == 1 and k.stride() == v.stride() and cpu_extension.usable(q, k, v)
                and cpu_extension.extension().vectorized_for(q.shape[-1]))

    def _kernel(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *prefix: torch.Tensor) -> torch.Tensor:
        """The C++ prefill over the packed sequences (prefix: k_cache, v_cache, prefix pages and
        their bounds, for sequences after a cached prefix)."""
        if self.starts is None:
            self.starts = torch.tensor([0] + [end for _, end in self.bounds], dtype=torch.int64)
        out = torch.empty(q.shape, dtype=q.dtype)
        cpu_extension.extension().causal_prefill(q, k, v, self.starts, q.shape[-1] ** -0.5, out, True, *prefix)
        return out

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self._kernel_takes(q, k, v):
            return self._kernel(q, k, v)
        group = q.shape[1] // k.shape[1]
        out = torch.empty_like(q)
        for start, end in self.bounds:
            qs = q[start:end].transpose(0, 1)
            ks = k[start:end].transpose(0, 1).repeat_interleave(group, dim=0)
            vs = v[start:end].transpose(0, 1).repeat_interleave(group, dim=0)
            out[start:end] = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True).transpose(0, 1)
        return out


class KVWriter:
    """Writes one forward pass's new K/V into the pool, layer by layer.

    The writer tag and fill level are stamped by the store itself, once per forward pass
    (with the first layer's write: `filled` counts token slots, so stamping twice would
    count twice). Where the kernels offer a plan (torch path), slots are resolved once.
    """

    def __init__(self, pool, kernels: KernelSet, slot_mapping, writer_tags):
        self.pool, self.kernels = pool, kernels
        self.slot_mapping, self.writer_tags = slot_mapping, writer_tags
        self.plan = kernels.plan_store(slot_mapping, pool.page_size) if kernels.plan_store else None
        self.stamped = False

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        pool, kernels = self.pool, self.kernels
        k_cache, v_cache = pool.k_cache(layer), pool.v_cache(layer)
        if self.plan is None:
            kernels.store_kv(k_cache, v_cache, k, v, self.slot_mapping, self.writer_tags, pool.writer, pool.filled,
                             pool.token_writer, stamp=not self.stamped)
            self.stamped = True
        elif self.stamped:
            kernels.store_planned(k_cache, v_cache, k, v, self.plan)
        else:
            kernels.store_planned(k_cache, v_cache, k, v, self.plan, self.writer_tags, pool.writer, pool.filled,
                                  pool.token_writer)
            self.stamped = True


class PagedPrefillAttention(DenseCausalAttention):
    def __init__(self, pool, kernels: KernelSet, seq_lens: list[int], slot_mapping, writer_tags):
        super().__init__(seq_lens)
        self.kv = KVWriter(pool, kernels, slot_mapping, writer_tags)

    def attend(self, layer, q, k, v):
        self.kv.write(layer, k, v)
        return super().attend(layer, q, k, v)


class PagedPrefixPrefillAttention(PagedPrefillAttention):
    """A prefill whose leading prompt pages came from the prefix cache: each sequence computes
    only its suffix, whose queries attend the cached prefix (read from the pool, token slots
    the caller checked against I1) and then, causally, the suffix itself.

    The C++ kernel reads the prefix in place from the pool's pages (one call for the batch);
    where it cannot run, each sequence gathers its prefix and runs SDPA with a mask."""

    def __init__(self, pool, kernels: KernelSet, seq_lens: list[int], slot_mapping, writer_tags,
                 prefix_pages: list[torch.Tensor]):
        """prefix_pages: per sequence, int64 ids of the whole pages its cached prefix fills
        (empty: none cached)."""
        super().__init__(pool, kernels, seq_lens, slot_mapping, writer_tags)
        self.pool = pool
        self.prefix_pages = prefix_pages
        self.cached = [len(pages) * pool.page_size for pages in prefix_pages]
        self.longest = max((n + c for n, c in zip(seq_lens, self.cached)), default=0)
        self._flat_pages = torch.cat(prefix_pages) if prefix_pages else torch.empty(0, dtype=torch.int64)
        self._prefix_starts = torch.tensor([0, *itertools.accumulate(len(p) for p in prefix_pages)],
                                           dtype=torch.int64)
        self._masks: dict[tuple[int, int], torch.Tensor] = {}

    def attend(self, layer, q, k, v):
        self.kv.write(layer, k, v)
        k_cache, v_cache = self.pool.k_cache(layer), self.pool.v_cache(layer)
        if self._kernel_takes(q, k, v) and cpu_extension.usable(k_cache, v_cache):
            return self._kernel(q, k, v, k_cache, v_cache, self._flat_pages, self._prefix_starts)
        group = q.shape[1] // k.shape[1]
        out = torch.empty_like(q)
        for (start, end), cached, pages in zip(self.bounds, self.cached, self.prefix_pages):
            ks, vs = k[start:end], v[start:end]
            if cached:
                ks = torch.cat([k_cache[pages].reshape(cached, *ks.shape[1:]), ks])
                vs = torch.cat([v_cache[pages].reshape(cached, *vs.shape[1:]), vs])
            qs = q[start:end].transpose(0, 1)
            ks = ks.transpose(0, 1).repeat_interleave(group, dim=0)
            vs = vs.transpose(0, 1).repeat_interleave(group, dim=0)
            mask = self._mask(end - start, cached, q.device) if cached else None
            out[start:end] = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask,
                                                            is_causal=not cached).transpose(0, 1)
        return out

    def _mask(self, n: int, cached: int, device) -> torch.Tensor:
        """[n, cached + n] bool: suffix query i sees every cached token and suffix tokens <= i."""
        key = (n, cached)
        if key not in self._masks:
            row = torch.arange(n, device=device)[:, None]
            col = torch.arange(cached + n, device=device)[None, :]
            self._masks[key] = col <= row + cached
        return self._masks[key]


class PagedDecodeAttention:
    """One new token per sequence; q is [B, H, D]."""

    def __init__(
        self, pool, kernels: KernelSet, *, block_table, expected_tags, seq_lens,
        slot_mapping, writer_tags, check_tags: bool, mask_foreign: bool = True, want_mask: bool = False,
        page_keys=None, expected_keys=None,
    ):
        """check_tags: count token slots that fail I1 (the detector). mask_foreign: also keep
        them out of attention (the defence). want_mask: keep which tokens were attended
        (`attended`, [B, T] bool) for the provenance audit. `violations` ends as [B, 2]:
        (foreign, unwritten) slots each row needed."""
        self.pool, self.kernels = pool, kernels
        self.kv = KVWriter(pool, kernels, slot_mapping, writer_tags)
        self.block_table, self.expected_tags, self.seq_lens = block_table, expected_tags, seq_lens
        self.check_tags = check_tags
        self.mask_foreign = mask_foreign
        # the prefix keys of shared pages (pool [num_pages], table [B, P]); None: none is keyed
        self.page_keys, self.expected_keys = page_keys, expected_keys
        self.want_mask = want_mask
        self.attended = None
        self._counted = None
        self._kernel_violations = torch.zeros(len(seq_lens), 2, dtype=torch.int32, device=pool.device)
        self.violations = torch.zeros(len(seq_lens), 2, dtype=torch.int32, device=pool.device)
        self.out: torch.Tensor | None = None
        self.plan = None

    def attend(self, layer, q, k, v):
        pool, kernels = self.pool, self.kernels
        self.kv.write(layer, k, v)
        if self.out is None:
            self.out = torch.empty_like(q)
        k_cache, v_cache, scale = pool.k_cache(layer), pool.v_cache(layer), q.shape[-1] ** -0.5
        if kernels.plan_decode is not None:
            if self.plan is None:  # after the first layer's store: tags and fills are final
                self.plan = kernels.plan_decode(
                    self.block_table, self.expected_tags, self.seq_lens, pool.token_writer,
                    pool.page_size, self.check_tags, self.mask_foreign,
                    page_keys=self.page_keys, expected_keys=self.expected_keys,
                )
                self.violations = self.plan.violations
                if self.want_mask:
                    self.attended = ~self.plan.blocked[:, :, 0, 0]
            return kernels.attend_planned(q, k_cache, v_cache, self.plan, scale=scale, out=self.out)
        if layer == 0 and (self.want_mask or (self.check_tags and not self.mask_foreign)):
            # the kernel either masks and counts or does neither: count (and see) separately
            from kernels.paged_attention_ref import plan_decode

            plan = plan_decode(self.block_table, self.expected_tags, self.seq_lens, pool.token_writer,
                               pool.page_size, self.check_tags, self.mask_foreign,
                               page_keys=self.page_keys, expected_keys=self.expected_keys)
            self.attended = ~plan.blocked[:, :, 0, 0]
            self._counted = plan.violations
        # Every layer sees the same tags, so each call recounts the same violations.
        masking = self.check_tags and self.mask_foreign
        out, counted = kernels.paged_decode_attention(
            q, k_cache, v_cache, self.block_table, self.expected_tags, self.seq_lens,
            pool.token_writer, scale=scale, check_tags=masking,
            out=self.out, violations=self._kernel_violations,
            page_keys=self.page_keys, expected_keys=self.expected_keys,
        )
        self.violations = self._counted if self._counted is not None else counted
        return out
