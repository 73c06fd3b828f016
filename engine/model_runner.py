"""ModelRunner: turns scheduled requests into one forward pass over the paged pool."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.attention import PagedDecodeAttention, PagedPrefillAttention, PagedPrefixPrefillAttention
from engine.kv.page_pool import PagePool
from engine.kv.page_table import block_keys, block_tables
from engine.wire.page_tags import NO_WRITER, SHARED_OWNER
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


def _column_truth(table, columns: np.ndarray) -> np.ndarray:
    """The content identity the table's request expects at each page column (0: none)."""
    truth = table.truth
    columns = np.asarray(columns, dtype=np.int64)
    if truth is None or not len(truth):
        return np.zeros(len(columns), dtype=np.int64)
    return np.where(columns < len(truth), truth[np.minimum(columns, len(truth) - 1)], 0)


def _foreign_content(pool: PagePool, pages: np.ndarray, prov: np.ndarray, reader: int,
                     own_truth: np.ndarray) -> np.ndarray:
    """(page, content slot) pairs where `prov` ([k, page_size] provenance of the read slots
    of `pages`, -1 where unread) holds another request's content whose identity is not the
    reader's own for that page (`own_truth`, [k])."""
    identity = pool.identity[pages] if pool.identity is not None else np.zeros(prov.shape, dtype=np.int64)
    own_prefix = (identity != 0) & (identity == own_truth[:, None])
    foreign = (prov >= 0) & (prov != reader) & ~own_prefix
    if not foreign.any():
        return _NO_READS
    rows, _ = np.nonzero(foreign)
    pairs = np.stack([pages[rows], prov[foreign]], axis=1).astype(np.int64)
    return np.unique(pairs, axis=0)


class ModelRunner:
    """check_writer_tags is the I1 defence (mask foreign pages, skip writes into them);
    detect is the I1 detector (count them), on unless measuring its cost."""

    def __init__(self, decoder: CausalDecoder, pool: PagePool, kernels: KernelSet, *, check_writer_tags: bool = True):
        self.decoder = decoder
        self.pool = pool
        self.kernels = kernels
        self.check_writer_tags = check_writer_tags
        self.detect = True
        self.write_into_shared = False  # the shared_page_written fault
        self.device = pool.device
        self._tables_key: tuple[int, ...] | None = None
        self._tables = None

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array).to(self.device, non_blocking=True)

    def prefill(self, requests: list[Request]) -> torch.Tensor:
        """Run every prompt (packed) from its first token not taken from the prefix cache,
        store its K/V in its pages and stamp the prefix keys of the full pages it wrote.
        Returns [n, V] logits of each prompt's last token."""
        starts = [r.cached_tokens for r in requests]
        spans = [np.arange(s, r.prompt_len, dtype=np.int64) for r, s in zip(requests, starts)]
        lens = [len(span) for span in spans]
        tokens = np.concatenate([np.asarray(r.prompt_ids, dtype=np.int64)[s:] for r, s in zip(requests, starts)])
        positions = np.concatenate(spans)
        slots = np.concatenate([r.page_table.slot_mapping(span) for r, span in zip(requests, spans)])
        tags = np.concatenate([r.page_table.tags_for(span) for r, span in zip(requests, spans)])
        if any(starts):
            ps = self.pool.page_size
            if any(s % ps for s in starts):  # the cache shares whole pages only; a part would go unattended
                raise ValueError(f"cached prefixes {starts} are not whole pages of {ps} tokens")
            prefix = [self._tensor(r.page_table.pages[: s // ps].astype(np.int64)) for r, s in zip(requests, starts)]
            ctx = PagedPrefixPrefillAttention(self.pool, self.kernels, lens, self._tensor(slots), self._tensor(tags),
                                              prefix)
        else:
            ctx = PagedPrefillAttention(self.pool, self.kernels, lens, self._tensor(slots), self._tensor(tags))
        self.pool.mark_dirty(slots // self.pool.page_size)
        self.pool.record_content(slots, np.repeat([r.slot for r in requests], lens),
                                 np.concatenate([_column_truth(r.page_table, span // self.pool.page_size)
                                                 for r, span in zip(requests, spans)]))
        last_rows = np.cumsum(lens) - 1
        logits = self.decoder(
            self._tensor(tokens), self._tensor(positions), ctx, logit_rows=self._tensor(last_rows)
        )
        self._stamp_keys(requests, starts)
        return logits

    def _stamp_keys(self, requests: list[Request], starts: list[int]) -> None:
        """The prefix key of every full prompt page this pass wrote, beside its bytes."""
        ps = self.pool.page_size
        for request, start in zip(requests, starts):
            table = request.page_table
            if table.keys is None:
                continue
            columns = np.arange(start // ps, request.prompt_len // ps)
            if len(columns):
                index = torch.from_numpy(table.pages[columns].astype(np.int64)).to(self.device)
                self.pool.page_key[index] = torch.from_numpy(table.keys[columns]).to(self.device)

    def prefix_violations(self, request: Request) -> tuple[int, int, list[int]]:
        """I1 over the cached prefix a prefill is about to attend: (foreign, unwritten) token
        slots and the pages holding them. A slot is the request's to read when its tag is the one
        its table expects and its page's key is the one the request computed itself."""
        table, ps = request.page_table, self.pool.page_size
        n = request.cached_tokens // ps
        if not n:
            return 0, 0, []
        pages = table.pages[:n]
        index = torch.from_numpy(pages.astype(np.int64)).to(self.device)
        tags = self.pool.token_writer[index].cpu().numpy()
        keys = self.pool.page_key[index].cpu().numpy()
        ok = (tags == table.expected_tags()[:n, None]) & (keys == table.expected_keys()[:n])[:, None]
        unwritten = ~ok & (tags == NO_WRITER)
        foreign = ~ok & ~unwritten
        bad = pages[(~ok).any(axis=1)]
        return int(foreign.sum()), int(unwritten.sum()), [int(p) for p in bad]

    def prefix_cross_reads(self, request: Request) -> np.ndarray:
        """Ground truth for the cached prefix a prefill attended: (page, content slot) pairs
        holding another request's content that is not the reader's own prefix."""
        prov = self.pool.provenance
        n = request.cached_tokens // self.pool.page_size
        if prov is None or not n:
            return _NO_READS
        pages = request.page_table.pages[:n]
        return _foreign_content(self.pool, pages, prov[pages], request.slot,
                                _column_truth(request.page_table, np.arange(n)))

    def decode(self, requests: list[Request]) -> DecodeResult:
        """One new token per request: its last sampled token at position num_tokens - 1."""
        n, pool, ps = len(requests), self.pool, self.pool.page_size
        positions = np.fromiter((r.num_tokens - 1 for r in requests), dtype=np.int64, count=n)
        tokens = np.fromiter((r.output_ids[-1] for r in requests), dtype=np.int64, count=n)
        reader = np.fromiter((r.slot for r in requests), dtype=np.int64, count=n)
        pages, expected, pages_t, expected_t, keys_t, shared = self._block_tables(requests)
        rows, columns = np.arange(n), positions // ps
        slots = pages[rows, columns].astype(np.int64) * ps + positions % ps
        if self.write_into_shared:
            slots = self._misdirect(requests, pages, slots)
        # The block-table check, on the host: every page a request reads or writes must still
        # be its own, in the epoch it was granted (a stale page table names pages that are not),
        # or a page it holds through the prefix cache, which it may read and never write.
        # It protects the page's real owner: with the defence on, no write goes into it.
        in_use = np.arange(pages.shape[1])[None, :] <= columns[:, None]
        owner, same_epoch = pool.owner[pages], pool.epoch[pages] == (expected & 0xFFFFFFFF)
        owned = (owner == reader[:, None]) & same_epoch
        held = owned if shared is None else owned | (shared & (owner == SHARED_OWNER) & same_epoch)
        foreign = in_use & ~held
        not_owned = [pages[b][foreign[b]] for b in range(n)] if foreign.any() else [_NONE] * n
        writable = pool.owner[slots // ps] == reader
        if self.check_writer_tags and (foreign.any() or not writable.all()):
            if foreign.any():
                expected_t = self._tensor(np.where(foreign, NOT_YOURS, expected))
            slots = np.where(writable & ~foreign[rows, columns], slots, -1)  # never write into another's page
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
            page_keys=pool.page_key if keys_t is not None else None, expected_keys=keys_t,
        )
        logits = self.decoder(self._tensor(tokens), self._tensor(positions), ctx)
        violations = ctx.violations.cpu().numpy().reshape(n, 2)
        cross = self._cross_reads(requests, pages, ctx.attended) if audit else [_NO_READS] * n
        return DecodeResult(logits, violations, not_owned, cross)

    def _misdirect(self, requests, pages, slots):
        """The shared_page_written fault: a request that took pages from the prefix cache
        writes its first new token into the last of them, where its own next slot should have
        been (the other holders of that page read it)."""
        ps = self.pool.page_size
        slots = slots.copy()
        for b, request in enumerate(requests):
            taken = request.cached_tokens // ps
            if taken and len(request.output_ids) == 1:
                slots[b] = int(pages[b, taken - 1]) * ps + int(slots[b]) % ps
        return slots

    def _cross_reads(self, requests: list[Request], pages: np.ndarray, attended) -> list[np.ndarray]:
        """Ground truth: the token slots each request actually attended to that hold another
        request's content (provenance) that is not its own prefix, as unique (page, content
        slot) pairs."""
        ps = self.pool.page_size
        width = attended.shape[1] // ps
        flat_seen = attended.cpu().numpy()
        reader = np.fromiter((r.slot for r in requests), dtype=np.int64, count=len(requests))
        prov_all = self.pool.provenance[pages[:, :width]].reshape(len(requests), -1)
        if not (flat_seen & (prov_all >= 0) & (prov_all != reader[:, None])).any():
            return [_NO_READS] * len(requests)  # the common case: nothing but its own content read
        seen = flat_seen.reshape(len(requests), width, ps)
        out = []
        for b, request in enumerate(requests):
            cols = np.flatnonzero(seen[b].any(axis=1))
            if not len(cols):
                out.append(_NO_READS)
                continue
            page_ids = pages[b, cols]
            prov = np.where(seen[b, cols], self.pool.provenance[page_ids], -1)
            out.append(_foreign_content(self.pool, page_ids, prov, request.slot,
                                        _column_truth(request.page_table, cols)))
        return out

    def _block_tables(self, requests: list[Request]):
        """Block tables of the batch, rebuilt only when its membership changes: a request's
        pages are reserved whole when it starts and never change while it runs (offering its
        own pages to the prefix cache changes neither their tags nor their keys)."""
        key = tuple(r.slot for r in requests)
        if self._tables_key != key:
            tables = [r.page_table for r in requests]
            pages, expected = block_tables(tables)
            keys = block_keys(tables, pages.shape[1]) if any(t.keys is not None for t in tables) else None
            shared = None
            if any(t.shared is not None for t in tables):
                shared = np.zeros(pages.shape, dtype=bool)
                for row, t in enumerate(tables):
                    if t.shared is not None:
                        shared[row, : len(t.shared)] = t.shared
            self._tables = (pages, expected, self._tensor(pages), self._tensor(expected),
                            None if keys is None else self._tensor(keys), shared)
            self._tables_key = key
        return self._tables
