"""Paged decode attention in plain torch: the CPU production path and the oracle for Triton.

One query token per sequence attends over its pages (GQA), with the per-page writer-tag
check of invariant I1: a page written by someone else is masked out and counted, and a
page is only read up to the tokens its writer actually put there (`filled`).
"""

from __future__ import annotations

import torch

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


def _token_mask(block_table, expected_tags, seq_lens, writer, filled, page_size, check_tags):
    """Return (pages to gather [B, P], attend mask [B, P*page_size], violations [B] int32)."""
    batch, num_pages_seq = block_table.shape
    page_start = torch.arange(num_pages_seq, device=block_table.device) * page_size
    lens = seq_lens.to(torch.int64)[:, None]
    page_used = page_start[None, :] < lens
    # padding entries may hold garbage (e.g. -1): never index the pool with them
    pages = torch.where(page_used, block_table.to(torch.int64), 0)
    slot = torch.arange(page_size, device=block_table.device)
    token_pos = page_start[:, None] + slot[None, :]
    attend = (token_pos[None] < lens[:, :, None]).reshape(batch, -1)
    violations = torch.zeros(batch, dtype=torch.int32, device=block_table.device)
    if not check_tags:
        return pages, attend, violations
    tag_ok = writer[pages] == expected_tags
    page_filled = filled[pages].to(torch.int64)
    needed = (lens - page_start[None, :]).clamp(0, page_size)
    bad = page_used & (~tag_ok | (page_filled < needed))
    violations = bad.sum(dim=1, dtype=torch.int32)
    readable = tag_ok[:, :, None] & (slot[None, None, :] < page_filled[:, :, None])
    return pages, attend & readable.reshape(batch, -1), violations


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    expected_tags: torch.Tensor,
    seq_lens: torch.Tensor,
    writer: torch.Tensor,
    filled: torch.Tensor,
    *,
    scale: float,
    check_tags: bool = True,
    out: torch.Tensor | None = None,
    violations: torch.Tensor | None = None,
    partition_size: int = 512,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attend one query token per sequence over its KV pages; return (out [B, H, D], violations [B]).

    Token t of sequence b is read from page block_table[b, t // page_size], slot
    t % page_size. With check_tags, pages whose writer tag differs from expected_tags are
    masked and only the first filled[page] tokens of a page are read; violations[b] counts
    the pages of b that were masked or under-filled. Rows with nothing to attend are zero.
    partition_size is accepted for signature parity with the Triton kernel and ignored.
    Raises ValueError on inconsistent shapes or when a seq_len needs more pages than
    block_table holds.
    """
    validate_decode_inputs(q, k_cache, v_cache, block_table, expected_tags, seq_lens)
    batch = q.shape[0]
    if out is None:
        out = torch.empty_like(q)
    if violations is None:
        violations = torch.empty(batch, dtype=torch.int32, device=q.device)
    # bound the gathered float32 K/V copy so batch 64 x 16k context stays in memory
    per_seq = block_table.shape[1] * k_cache[0].numel() * 2 * 4
    chunk = max(1, _GATHER_BUDGET_BYTES // max(per_seq, 1))
    for lo in range(0, batch, chunk):
        rows = slice(lo, lo + chunk)
        out[rows], violations[rows] = _attend_rows(
            q[rows], k_cache, v_cache, block_table[rows], expected_tags[rows], seq_lens[rows],
            writer, filled, scale, check_tags,
        )
    return out, violations


def _attend_rows(q, k_cache, v_cache, block_table, expected_tags, seq_lens, writer, filled,
                 scale, check_tags):
    """Attention for a slice of sequences; returns (out [b, H, D] in q.dtype, violations [b])."""
    batch, num_heads, head_dim = q.shape
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    max_len = int(seq_lens.max()) if batch else 0
    pages_needed = -(-max_len // page_size)
    if pages_needed > block_table.shape[1]:
        raise ValueError(
            f"seq_len {max_len} needs {pages_needed} pages but block_table has {block_table.shape[1]}"
        )
    if pages_needed == 0:
        return torch.zeros_like(q), torch.zeros(batch, dtype=torch.int32, device=q.device)
    # only gather the pages the longest sequence uses
    pages, attend, viol = _token_mask(
        block_table[:, :pages_needed], expected_tags[:, :pages_needed], seq_lens,
        writer, filled, page_size, check_tags,
    )
    k = k_cache[pages].reshape(batch, -1, num_kv_heads, head_dim).float()
    v = v_cache[pages].reshape(batch, -1, num_kv_heads, head_dim).float()
    # masked slots may hold NaN (poison scrub, foreign data): 0 * NaN would leak into out
    v.masked_fill_(~attend[:, :, None, None], 0.0)
    qf = q.reshape(batch, num_kv_heads, group, head_dim).float()
    out = torch.empty(batch, num_kv_heads, group, head_dim, dtype=torch.float32, device=q.device)
    skip = ~attend[:, None, :]  # [b, 1, T]
    # per kv head, k[:, :, head] is a strided [b, T, D] batch bmm takes without a transposing copy
    for head in range(num_kv_heads):
        scores = torch.bmm(qf[:, head], k[:, :, head].transpose(1, 2))
        scores.mul_(scale).masked_fill_(skip, float("-inf"))
        row_max = scores.amax(dim=-1, keepdim=True)
        # a fully masked row has max -inf; shift by 0 instead so exp gives 0, not NaN
        row_max.masked_fill_(~torch.isfinite(row_max), 0.0)
        probs = scores.sub_(row_max).exp_()
        denom = probs.sum(dim=-1, keepdim=True).clamp_min_(torch.finfo(torch.float32).tiny)
        out[:, head] = torch.bmm(probs, v[:, :, head]).div_(denom)
    return out.reshape(batch, num_heads, head_dim).to(q.dtype), viol
