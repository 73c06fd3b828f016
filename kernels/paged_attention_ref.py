"""Paged decode attention in plain torch: the CPU production path and the oracle for Triton.

One query token per sequence attends over its pages (GQA), with the per-token writer-tag
check of invariant I1: every token slot carries the tag of the code that last wrote it, and
a reader may attend a slot only if that tag is the one its table expects for the page (its
own for the epoch of its grant, or, for a page it shares through the prefix cache, the
page's original writer) and the page's prefix key equals the key the reader computed from
its own tokens and salt (0 on both sides for a page that is not keyed). A slot failing
either is foreign, or unwritten when nobody wrote it since its last scrub; both are masked
out and counted, each kind on its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

_GATHER_BUDGET_BYTES = 256 << 20


def validate_decode_inputs(q, k_cache, v_cache, block_table, expected_tags, seq_lens) -> None:
    """Check shapes shared by both backends.

    Raises ValueError naming the offending tensor and the shape it should have.
    """
    if q.dim() != 3:
        raise ValueError(f"q must be [batch, heads, head_dim], got shape {tuple(q.shape)}")
    batch, num_heads, head_dim = q.shape
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            "k_cache and v_cache must both be [num_pages, page_size, kv_heads, head_dim], "
            f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    num_kv_heads = k_cache.shape[2]
    if k_cache.shape[3] != head_dim or num_heads % num_kv_heads != 0:
        raise ValueError(
            f"q has {num_heads} heads of dim {head_dim}; cache has {num_kv_heads} kv heads of dim "
            f"{k_cache.shape[3]} (query heads must be a multiple of kv heads, same head_dim)"
        )
    if q.dtype != k_cache.dtype or v_cache.dtype != k_cache.dtype:
        raise ValueError(f"q, k_cache, v_cache must share a dtype, got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    if block_table.dim() != 2 or block_table.shape[0] != batch:
        raise ValueError(f"block_table must be [{batch}, pages], got {tuple(block_table.shape)}")
    if expected_tags.shape != block_table.shape:
        raise ValueError(
            f"expected_tags must match block_table {tuple(block_table.shape)}, "
            f"got {tuple(expected_tags.shape)}"
        )
    if seq_lens.shape != (batch,):
        raise ValueError(f"seq_lens must be [{batch}], got {tuple(seq_lens.shape)}")


def _check_keys(page_keys, expected_keys, num_pages: int, table_shape) -> None:
    if (page_keys is None) != (expected_keys is None):
        raise ValueError("page_keys and expected_keys go together: give both or neither")
    if page_keys is not None and (page_keys.shape != (num_pages,) or expected_keys.shape != table_shape):
        raise ValueError(f"page_keys must be [{num_pages}] and expected_keys {tuple(table_shape)}, got "
                         f"{tuple(page_keys.shape)} and {tuple(expected_keys.shape)}")


@dataclass
class DecodePlan:
    """What one decode step's attention needs beyond K/V, computed once for all layers.

    The token tags cannot change between the layers of one forward pass (every layer's
    store writes the same slots with the same tag), so the torch path checks I1 once per
    step and reuses the mask; the Triton kernel re-checks in every layer.
    """

    pages: torch.Tensor  # [B, P] int64 pool pages to gather (padding -> 0)
    blocked: torch.Tensor  # [B, P * page_size, 1, 1] bool: tokens that may not be read
    violations: torch.Tensor  # [B, 2] int32: (foreign, unwritten) token slots the row needed
    empty_rows: torch.Tensor | None  # [B] bool where a row has nothing to attend, else None
    foreign: torch.Tensor | None = None  # [B, P * page_size] bool (check_tags only): foreign slots
    # The gather path's own forms of `blocked`, made by its first attend_planned (the in-place
    # CPU kernel reads `blocked` itself and never needs them):
    # [B, 1, 1, P * page_size] float32: 0 or -inf, the mask for SDPA
    bias: torch.Tensor | None = None
    # [k] int64: the blocked tokens as flat indices into [B * P * page_size], for zeroing the
    # gathered K and V rows in one indexed write each (a broadcast masked_fill took as long
    # as the gather; K too, or a poisoned NaN in K reaches the output through 0 * NaN)
    blocked_rows: torch.Tensor | None = None
    # the gathered K/V of one layer, reused by every layer of the step (no fresh allocation
    # and page faults per layer), and the rows attended per gather, each with its own
    # blocked_rows: both made by the first attend_planned
    gather_buffers: tuple[torch.Tensor, torch.Tensor] | None = None
    chunks: list[tuple[int, int, torch.Tensor]] | None = None


NO_WRITER = -1  # the tag of a slot nothing wrote since its last scrub (engine.wire.page_tags)


def pages_needed(block_table, seq_lens, page_size: int) -> int:
    """Page columns the longest row needs; raises ValueError when block_table has fewer."""
    max_len = int(seq_lens.max()) if block_table.shape[0] else 0
    num_pages_seq = -(-max_len // page_size)
    if num_pages_seq > block_table.shape[1]:
        raise ValueError(
            f"seq_len {max_len} needs {num_pages_seq} pages but block_table has {block_table.shape[1]}"
        )
    return num_pages_seq


def plan_decode(block_table, expected_tags, seq_lens, token_writer, page_size: int,
                check_tags: bool = True, mask_foreign: bool = True, *,
                page_keys=None, expected_keys=None) -> DecodePlan:
    """Resolve pages, the I1 mask and the violation counts for one decode step.

    token_writer is the pool's [num_pages, page_size] int64 writer tag of every token slot;
    page_keys the pool's [num_pages] int64 prefix key of every page and expected_keys the
    [B, P] key each row computed for its page columns (both None: no page is keyed).
    mask_foreign=False counts violations without masking them (the defence off, the
    detector on). Raises ValueError when a seq_len needs more pages than block_table holds.
    """
    batch = block_table.shape[0]
    num_pages_seq = pages_needed(block_table, seq_lens, page_size)
    block_table, expected_tags = block_table[:, :num_pages_seq], expected_tags[:, :num_pages_seq]
    device = block_table.device
    page_start = torch.arange(num_pages_seq, device=device) * page_size
    # tokens the reader needs from each of its pages: 0 for padding columns
    needed = (seq_lens.to(torch.int64)[:, None] - page_start[None, :]).clamp_(0, page_size)
    # padding entries may hold garbage (e.g. -1): never index the pool with them
    pages = torch.where(needed > 0, block_table.to(torch.int64), 0)
    slot = torch.arange(page_size, device=device)
    in_seq = slot[None, None, :] < needed[:, :, None]  # [B, P, page_size]
    foreign = None
    if check_tags:
        # I1, token by token: a slot is readable only if the reader itself wrote it in the
        # epoch of its grant; anything else was written by another request (or another
        # epoch), or by nobody since its scrub
        tags = token_writer[pages]
        mine = tags == expected_tags[:, :, None]
        if page_keys is not None:
            # a shared page is readable only by a reader whose own prefix (tokens and salt)
            # hashes to the page's key: a cache that matched on anything less is caught here
            mine &= (page_keys[pages] == expected_keys[:, :num_pages_seq])[:, :, None]
        unwritten = in_seq & ~mine & (tags == NO_WRITER)
        foreign = in_seq & ~mine & ~unwritten
        violations = torch.stack([foreign.sum(dim=(1, 2), dtype=torch.int32),
                                  unwritten.sum(dim=(1, 2), dtype=torch.int32)], dim=1)
        attend = (in_seq & mine) if mask_foreign else in_seq
        foreign = foreign.reshape(batch, -1)
    else:
        violations = torch.zeros(batch, 2, dtype=torch.int32, device=device)
        attend = in_seq
    attend = attend.reshape(batch, -1)
    empty = ~attend.any(dim=1)
    blocked = ~attend
    return DecodePlan(pages, blocked[:, :, None, None], violations, empty if bool(empty.any()) else None, foreign)


def attend_planned(q, k_cache, v_cache, plan: DecodePlan, *, scale: float,
                   out: torch.Tensor | None = None) -> torch.Tensor:
    """One layer's decode attention through a plan; returns out [B, H, D] in q.dtype."""
    batch = q.shape[0]
    if out is None:
        out = torch.empty_like(q)
    num_pages = plan.pages.shape[1]
    if num_pages == 0:
        return out.zero_()
    if plan.gather_buffers is None:  # the first layer of the step; every later one reuses these
        blocked = plan.blocked.reshape(batch, -1)
        plan.bias = torch.zeros(blocked.shape, dtype=torch.float32, device=q.device).masked_fill_(
            blocked, float("-inf"))[:, None, None, :]
        plan.blocked_rows = blocked.reshape(-1).nonzero().squeeze(1)
        # bound the gathered K/V copy so batch 64 x 16k context stays in memory
        per_seq = num_pages * k_cache[0].numel() * 2 * 4
        chunk = min(batch, max(1, _GATHER_BUDGET_BYTES // max(per_seq, 1)))
        shape = (chunk * num_pages, *k_cache.shape[1:])
        plan.gather_buffers = (torch.empty(shape, dtype=k_cache.dtype, device=k_cache.device),
                               torch.empty(shape, dtype=v_cache.dtype, device=v_cache.device))
        plan.chunks = _chunks(plan.blocked_rows, batch, chunk, num_pages * k_cache.shape[1])
    for lo, hi, rows in plan.chunks:
        _attend_rows(q[lo:hi], k_cache, v_cache, plan.pages[lo:hi], rows, plan.bias[lo:hi], scale, out[lo:hi],
                     plan.gather_buffers)
    if plan.empty_rows is not None:
        out[plan.empty_rows] = 0  # nothing readable: zeros, not SDPA's NaN
    return out


def _chunks(blocked_rows, batch: int, chunk: int, tokens_per_row: int) -> list[tuple[int, int, torch.Tensor]]:
    """(first row, end row, that chunk's blocked tokens as flat indices local to it) for
    each chunk of at most `chunk` rows; computed once per step, used by every layer."""
    if chunk >= batch:
        return [(0, batch, blocked_rows)]
    chunks = []
    for lo in range(0, batch, chunk):
        hi = min(batch, lo + chunk)
        start, end = lo * tokens_per_row, hi * tokens_per_row
        chunks.append((lo, hi, blocked_rows[(blocked_rows >= start) & (blocked_rows < end)] - start))
    return chunks


def _attend_rows(q, k_cache, v_cache, pages, blocked_rows, bias, scale, out, buffers) -> None:
    n, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    flat = pages.reshape(-1)
    k_buf, v_buf = (buf[: flat.shape[0]] for buf in buffers)
    torch.index_select(k_cache, 0, flat, out=k_buf)
    torch.index_select(v_cache, 0, flat, out=v_buf)
    k = k_buf.view(n, -1, num_kv_heads, head_dim).float()
    v = v_buf.view(n, -1, num_kv_heads, head_dim).float()
    # masked slots may hold NaN (poison scrub, foreign data) in K and in V: a NaN score stays
    # NaN under the -inf bias, and 0 * NaN leaks through V; either would turn the row to NaN.
    # In place: the gather above made a private copy.
    k.view(-1, num_kv_heads * head_dim).index_fill_(0, blocked_rows, 0.0)
    v.view(-1, num_kv_heads * head_dim).index_fill_(0, blocked_rows, 0.0)
    qf = q.reshape(n, num_kv_heads, -1, head_dim).float()
    result = F.scaled_dot_product_attention(qf, k.transpose(1, 2), v.transpose(1, 2), attn_mask=bias, scale=scale)
    out.copy_(result.reshape(n, num_heads, head_dim))


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    expected_tags: torch.Tensor,
    seq_lens: torch.Tensor,
    token_writer: torch.Tensor,
    *,
    scale: float,
    check_tags: bool = True,
    out: torch.Tensor | None = None,
    violations: torch.Tensor | None = None,
    partition_size: int = 512,
    page_keys: torch.Tensor | None = None,
    expected_keys: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attend one query token per sequence over its KV pages; return (out [B, H, D], violations [B, 2]).

    Token t of sequence b is read from page block_table[b, t // page_size], slot
    t % page_size. With check_tags, a token slot is read only when its writer tag
    (token_writer[page, slot]) equals expected_tags[b, page column] and, when page_keys
    ([num_pages]) and expected_keys ([B, P]) are given, the page's key equals the row's
    expected key for that column; violations[b] is
    (foreign, unwritten): the slots b needed that another writer or nobody wrote, all
    masked. Rows with nothing to attend are zero.
    partition_size is accepted for signature parity with the Triton kernel and ignored.
    Raises ValueError on inconsistent shapes or when a seq_len needs more pages than
    block_table holds.
    """
    validate_decode_inputs(q, k_cache, v_cache, block_table, expected_tags, seq_lens)
    if token_writer.shape != k_cache.shape[:2]:
        raise ValueError(f"token_writer must be [num_pages, page_size] = {tuple(k_cache.shape[:2])}, "
                         f"got {tuple(token_writer.shape)}")
    _check_keys(page_keys, expected_keys, k_cache.shape[0], block_table.shape)
    plan = plan_decode(block_table, expected_tags, seq_lens, token_writer, k_cache.shape[1], check_tags,
                       page_keys=page_keys, expected_keys=expected_keys)
    out = attend_planned(q, k_cache, v_cache, plan, scale=scale, out=out)
    if violations is None:
        return out, plan.violations
    violations.copy_(plan.violations)
    return out, violations
