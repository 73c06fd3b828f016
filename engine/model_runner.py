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

NOT_YOURS = -2  # an expected tag no writer ever stamps: the kernel masks the page


@dataclass
class DecodeResult:
    logits: torch.Tensor  # [B, V] float32
    # [B, 2] token slots each request needed that failed I1: (foreign: another writer's,
    # unwritten: nobody's since the last scrub); masked unless the defence is off
    violations: np.ndarray
    not_owned: list[np.ndarray]  # per request: its table's pages the pool says are not its own
    cross_reads: list[np.ndarray]  # per request: [k, 2] (page, content slot) read from others

    @property
    def foreign(self) -> np.ndarray:
        return self.violations[:, 0]

    @property
    def unwritten(self) -> np.ndarray:
        return self.violations[:, 1]


_NONE = np.empty(0, dtype=np.int32)
_NO_READS = np.empty((0, 2), dtype=np.int64)


class ModelRunner:
    """check_writer_tags is the I1 defence (mask foreign pages, skip writes into them);
    detect is the I1 detector (count them), on unless measuring its cost."""

    def __init__(self, decoder: CausalDecoder, pool: PagePool, kernels: KernelSet, *, check_writer_tags: bool = True):
        self.decoder = decoder
        self.pool = pool
        self.kernels = kernels
        self.check_writer_tags = check_writer_tags
        self.detect = True
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
        self.pool.record_content(slots, np.repeat([r.slot for r in requests], lens))
        last_rows = np.cumsum(lens) - 1
        return self.decoder(
            self._tensor(tokens), self._tensor(positions), ctx, logit_rows=self._tensor(last_rows)
        )

    def decode(self, requests: list[Request]) -> DecodeResult:
        """One new token per request: its last sampled token at position num_tokens - 1."""
        n, pool, ps = len(requests), self.pool, self.pool.page_size
        positions = np.fromiter((r.num_tokens - 1 for r in requests), dtype=np.int64, count=n)
        tokens = np.fromiter((r.output_ids[-1] for r in requests), dtype=np.int64, count=n)
        reader = np.fromiter((r.slot for r in requests), dtype=np.int64, count=n)
        pages, expected, pages_t, expected_t = self._block_tables(requests)
        rows, columns = np.arange(n), positions // ps
        slots = pages[rows, columns].astype(np.int64) * ps + positions % ps
        # The block-table check, on the host: every page a request reads or writes must still
        # be its own, in the epoch it was granted (a stale page table names pages that are not).
        # It protects the page's real owner: with the defence on, no write goes into it.
        in_use = np.arange(pages.shape[1])[None, :] <= columns[:, None]
        owned = (pool.owner[pages] == reader[:, None]) & (pool.epoch[pages] == (expected & 0xFFFFFFFF))
        foreign = in_use & ~owned
        not_owned = [pages[b][foreign[b]] for b in range(n)] if foreign.any() else [_NONE] * n
        if foreign.any() and self.check_writer_tags:
            expected_t = self._tensor(np.where(foreign, NOT_YOURS, expected))
            slots = np.where(foreign[rows, columns], -1, slots)  # never write into another's page
        written = slots >= 0
        pool.mark_dirty(slots[written] // ps)
        pool.record_content(slots[written], reader[written])
        audit = pool.provenance is not None
        ctx = PagedDecodeAttention(
            pool, self.kernels,
            block_table=pages_t, expected_tags=expected_t,
            seq_lens=self._tensor((positions + 1).astype(np.int32)),
            slot_mapping=self._tensor(slots), writer_tags=self._tensor(expected[rows, columns]),
            check_tags=self.detect, mask_foreign=self.check_writer_tags, want_mask=audit,
        )
        logits = self.decoder(self._tensor(tokens), self._tensor(positions), ctx)
        violations = ctx.violations.cpu().numpy().reshape(n, 2)
        cross = self._cross_reads(pages, reader, ctx.attended) if audit else [_NO_READS] * n
        return DecodeResult(logits, violations, not_owned, cross)

    def _cross_reads(self, pages: np.ndarray, reader: np.ndarray, attended) -> list[np.ndarray]:
        """Ground truth: the token slots each request actually attended to that hold another
        request's content (provenance), as unique (page, content slot) pairs."""
        width = attended.shape[1] // self.pool.page_size
        prov = self.pool.provenance[pages[:, :width]].reshape(len(reader), -1)
        seen = attended.cpu().numpy()
        foreign = seen & (prov >= 0) & (prov != reader[:, None])
        if not foreign.any():
            return [_NO_READS] * len(reader)
        out = []
        for b in range(len(reader)):
            cols = np.flatnonzero(foreign[b])
            pairs = np.stack([pages[b, cols // self.pool.page_size], prov[b, cols]], axis=1)
            out.append(np.unique(pairs, axis=0) if len(pairs) else _NO_READS)
        return out

    def _block_tables(self, requests: list[Request]):
        """Block tables of the batch, rebuilt only when its membership changes: a request's
        pages are reserved whole when it starts and never change while it runs."""
        key = tuple(r.slot for r in requests)
        if self._tables_key != key:
            pages, expected = block_tables([r.page_table for r in requests])
            self._tables = (pages, expected, self._tensor(pages), self._tensor(expected))
            self._tables_key = key
        return self._tables
