"""ModelRunner: turns scheduled requests into one forward pass over the paged pool."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.attention import PagedDecodeAttention, PagedPrefillAttention
from engine.kv.page_pool import PagePool
from engine.kv.page_table import block_tables
from engine.model.decoder import CausalDecoder
from engine.request import Request
from kernels.backend import KernelSet


@dataclass
class DecodeResult:
    logits: torch.Tensor  # [B, V] float32
    violations: np.ndarray  # [B] pages masked by the I1 check, per request


class ModelRunner:
    def __init__(self, decoder: CausalDecoder, pool: PagePool, kernels: KernelSet, *, check_writer_tags: bool = True):
        self.decoder = decoder
        self.pool = pool
        self.kernels = kernels
        self.check_writer_tags = check_writer_tags
        self.device = pool.device
        self._tables_key: tuple[int, ...] | None = None
        self._tables = None

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array).to(self.device, non_blocking=True)

    def prefill(self, requests: list[Request]) -> torch.Tensor:
        """Run every prompt (packed), store its K/V in its pages. Returns [n, V] logits
        of each prompt's last token."""
        lens = [r.prompt_len for r in requests]
        tokens = np.concatenate([np.asarray(r.prompt_ids, dtype=np.int64) for r in requests])
        positions = np.concatenate([np.arange(n, dtype=np.int64) for n in lens])
        slots = np.concatenate([r.page_table.slot_mapping(np.arange(n)) for r, n in zip(requests, lens)])
        tags = np.concatenate([r.page_table.tags_for(np.arange(n)) for r, n in zip(requests, lens)])
        ctx = PagedPrefillAttention(self.pool, self.kernels, lens, self._tensor(slots), self._tensor(tags))
        self.pool.mark_dirty(slots // self.pool.page_size)
        last_rows = np.cumsum(lens) - 1
        return self.decoder(
            self._tensor(tokens), self._tensor(positions), ctx, logit_rows=self._tensor(last_rows)
        )

    def decode(self, requests: list[Request]) -> DecodeResult:
        """One new token per request: its last sampled token at position num_tokens - 1."""
        n = len(requests)
        positions = np.fromiter((r.num_tokens - 1 for r in requests), dtype=np.int64, count=n)
        tokens = np.fromiter((r.output_ids[-1] for r in requests), dtype=np.int64, count=n)
        pages, expected, pages_t, expected_t = self._block_tables(requests)
        rows, columns = np.arange(n), positions // self.pool.page_size
        slots = pages[rows, columns].astype(np.int64) * self.pool.page_size + positions % self.pool.page_size
        self.pool.mark_dirty(pages[rows, columns])
        ctx = PagedDecodeAttention(
            self.pool, self.kernels,
            block_table=pages_t, expected_tags=expected_t,
            seq_lens=self._tensor((positions + 1).astype(np.int32)),
            slot_mapping=self._tensor(slots), writer_tags=self._tensor(expected[rows, columns]),
            check_tags=self.check_writer_tags,
        )
        logits = self.decoder(self._tensor(tokens), self._tensor(positions), ctx)
        return DecodeResult(logits, ctx.violations.cpu().numpy())

    def _block_tables(self, requests: list[Request]):
        """Block tables of the batch, rebuilt only when its membership changes: a request's
        pages are reserved whole when it starts and never change while it runs."""
        key = tuple(r.slot for r in requests)
        if self._tables_key != key:
            pages, expected = block_tables([r.page_table for r in requests])
            self._tables = (pages, expected, self._tensor(pages), self._tensor(expected))
            self._tables_key = key
        return self._tables
