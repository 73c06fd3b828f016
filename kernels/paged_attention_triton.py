"""Paged decode attention in Triton: split-K ("flash decoding") with the I1 token-tag check.

Phase 1, grid (batch, kv_heads, partitions): each program walks its partition of the
sequence in blocks of BLOCK_N tokens gathered across pages, for all G query heads of its
kv head at once, and leaves a partial running max, sum and weighted V. Phase 2, grid
(batch, heads): merges the partitions. Same semantics as paged_attention_ref.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels.paged_attention_ref import _check_keys, validate_decode_inputs

# finite start for the running max: m_i - m_new is never -inf - (-inf) = NaN when all is masked
_NEG_BIG = tl.constexpr(-1.0e30)
MERGE_CHUNK = 16  # partitions the merge holds at once (16 x head dim fp32 values a thread block)
_MAX_BLOCK_N = 64
# pinned: Triton 3.9 warns when it is left to the default (and the default is about to change)
_FP_FUSION = True


@triton.jit
def _decode_partition_kernel(
    q_ptr, k_ptr, v_ptr, block_table_ptr, expected_ptr, seq_lens_ptr, token_writer_ptr,
    page_keys_ptr, expected_keys_ptr,
    m_ptr, l_ptr, acc_ptr, violations_ptr,
    qk_scale, num_pool_pages, table_width, num_parts,
    stride_qb, stride_qh, stride_qd,
    stride_kp, stride_ks, stride_kh, stride_kd,
    stride_vp, stride_vs, stride_vh, stride_vd,
    stride_bt_b, stride_bt_p, stride_ex_b, stride_ex_p,
    PAGE_SIZE: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    PARTITION: tl.constexpr, BLOCK_N: tl.constexpr,
    CHECK_TAGS: tl.constexpr, KEYED: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    part = tl.program_id(2)
    seq_len = tl.minimum(tl.load(seq_lens_ptr + b), table_width * PAGE_SIZE)
    start = part * PARTITION
    end = tl.minimum(start + PARTITION, seq_len)

    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_DIM_PAD)
    head = kv_head * GROUP + g
    d_ok = d < HEAD_DIM
    q = tl.load(
        q_ptr + b * stride_qb + head[:, None] * stride_qh + d[None, :] * stride_qd,
        mask=(g[:, None] < GROUP) & d_ok[None, :], other=0.0,
    )
    m_i = tl.full([GROUP_PAD], _NEG_BIG, tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM_PAD], tl.float32)
    n_foreign = tl.zeros([BLOCK_N], tl.int32)
    n_unwritten = tl.zeros([BLOCK_N], tl.int32)

    for block_start in range(start, end, BLOCK_N):
        t = block_start + tl.arange(0, BLOCK_N)
        in_seq = t < end
        page_idx = t // PAGE_SIZE
        slot = t % PAGE_SIZE
        page = tl.load(
            block_table_ptr + b * stride_bt_b + page_idx * stride_bt_p, mask=in_seq, other=0
        ).to(tl.int64)
        # a corrupt table entry must not turn into a read of arbitrary memory
        ok = in_seq & (page >= 0) & (page < num_pool_pages)
        if CHECK_TAGS:
            # I1 per token slot: readable only if the reader wrote it in its grant's epoch
            tag = tl.load(token_writer_ptr + page * PAGE_SIZE + slot, mask=ok, other=-1)
            want = tl.load(expected_ptr + b * stride_ex_b + page_idx * stride_ex_p, mask=in_seq, other=0)
            mine = ok & (tag == want)
            if KEYED:
                # a shared page: its prefix key must be the one the reader computed itself
                key = tl.load(page_keys_ptr + page, mask=ok, other=0)
                want_key = tl.load(expected_keys_ptr + b * stride_ex_b + page_idx * stride_ex_p, mask=in_seq,
                                   other=0)
                mine = mine & (key == want_key)
            unwritten = ok & ~mine & (tag == -1)
            # a table entry outside the pool counts as foreign: it names nobody's data
            foreign = in_seq & ~mine & ~unwritten
            n_foreign += foreign.to(tl.int32)
            n_unwritten += unwritten.to(tl.int32)
            ok = mine
        if HEAD_DIM == HEAD_DIM_PAD:
            kv_mask = ok[:, None]
        else:
            kv_mask = ok[:, None] & d_ok[None, :]
        k = tl.load(
            k_ptr + page[:, None] * stride_kp + slot[:, None] * stride_ks
            + kv_head * stride_kh + d[None, :] * stride_kd,
            mask=kv_mask, other=0.0,
        )
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        s = tl.where(ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        v = tl.load(
            v_ptr + page[:, None] * stride_vp + slot[:, None] * stride_vs
            + kv_head * stride_vh + d[None, :] * stride_vd,
            mask=kv_mask, other=0.0,
        )
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new

    row = (b * (GROUP * tl.num_programs(1)) + head) * num_parts + part
    g_ok = g < GROUP
    tl.store(m_ptr + row, m_i, mask=g_ok)
    tl.store(l_ptr + row, l_i, mask=g_ok)
    tl.store(acc_ptr + row[:, None] * HEAD_DIM + d[None, :], acc, mask=g_ok[:, None] & d_ok[None, :])
    if CHECK_TAGS:
        # only kv head 0 reports, so a slot is not counted once per kv head
        bad_f = tl.sum(n_foreign, 0)
        bad_u = tl.sum(n_unwritten, 0)
        tl.atomic_add(violations_ptr + 2 * b, bad_f, mask=(bad_f > 0) & (kv_head == 0))
        tl.atomic_add(violations_ptr + 2 * b + 1, bad_u, mask=(bad_u > 0) & (kv_head == 0))


@triton.jit
def _merge_partitions_kernel(
    m_ptr, l_ptr, acc_ptr, seq_lens_ptr, out_ptr,
    table_width, num_parts, stride_ob, stride_oh, stride_od,
    PAGE_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    PARTITION: tl.constexpr, MERGE_CHUNK: tl.constexpr,
):
    # Two passes over the partitions, MERGE_CHUNK at a time: the running maximum, then the
    # weighted sums. Registers stay the same at any context (a [partitions, head dim] tile
    # held at once reached 255 registers and spilled from 131k tokens).
    b = tl.program_id(0)
    head = tl.program_id(1)
    seq_len = tl.minimum(tl.load(seq_lens_ptr + b), table_width * PAGE_SIZE)
    used = tl.cdiv(seq_len, PARTITION)
    base = (b * tl.num_programs(1) + head) * num_parts
    offs = tl.arange(0, MERGE_CHUNK)
    m_all = tl.max(tl.full((MERGE_CHUNK,), _NEG_BIG, tl.float32), 0)
    for start in range(0, used, MERGE_CHUNK):
        parts = start + offs
        m = tl.load(m_ptr + base + parts, mask=parts < used, other=_NEG_BIG)
        m_all = tl.maximum(m_all, tl.max(m, 0))
    d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = d < HEAD_DIM
    total = tl.sum(tl.zeros((MERGE_CHUNK,), tl.float32), 0)
    merged = tl.zeros((HEAD_DIM_PAD,), tl.float32)
    for start in range(0, used, MERGE_CHUNK):
        parts = start + offs
        part_ok = parts < used
        m = tl.load(m_ptr + base + parts, mask=part_ok, other=_NEG_BIG)
        l_part = tl.load(l_ptr + base + parts, mask=part_ok, other=0.0)
        weight = tl.where(part_ok, tl.exp2(m - m_all), 0.0)
        total += tl.sum(l_part * weight, 0)
        acc = tl.load(acc_ptr + (base + parts)[:, None] * HEAD_DIM + d[None, :],
                      mask=part_ok[:, None] & d_ok[None, :], other=0.0)
        merged += tl.sum(acc * weight[:, None], 0)
    # total >= 1 when anything was attended; 0 (and merged 0) gives the zero row
    result = merged / tl.maximum(total, 1e-30)
    tl.store(out_ptr + b * stride_ob + head * stride_oh + d * stride_od,
             result.to(out_ptr.dtype.element_ty), mask=d_ok)


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

    Same contract as kernels.paged_attention_ref.paged_decode_attention (prefix keys included), without a host
    sync: a seq_len beyond the block table is clamped to it, and a table entry outside the
    pool is never read (its slots count as foreign when check_tags). partition_size (a power
    of two >= 16) is the number of tokens one program reduces before the merge.
    Raises ValueError on inconsistent shapes or a bad partition_size.
    """
    validate_decode_inputs(q, k_cache, v_cache, block_table, expected_tags, seq_lens)
    _check_keys(page_keys, expected_keys, k_cache.shape[0], block_table.shape)
    keyed = page_keys is not None
    if keyed and expected_keys.stride() != expected_tags.stride():
        expected_keys = expected_keys.contiguous()
        expected_tags = expected_tags.contiguous()
    if token_writer.shape != k_cache.shape[:2] or not token_writer.is_contiguous():
        raise ValueError(f"token_writer must be a contiguous [num_pages, page_size] = {tuple(k_cache.shape[:2])}, "
                         f"got {tuple(token_writer.shape)}")
    if partition_size < 16 or partition_size & (partition_size - 1):
        raise ValueError(f"partition_size must be a power of two >= 16, got {partition_size}")
    batch, num_heads, head_dim = q.shape
    num_pool_pages, page_size, num_kv_heads = k_cache.shape[:3]
    group = num_heads // num_kv_heads
    table_width = block_table.shape[1]
    num_parts = max(1, triton.cdiv(table_width * page_size, partition_size))
    if out is None:
        out = torch.empty_like(q)
    if violations is None:
        violations = torch.zeros(batch, 2, dtype=torch.int32, device=q.device)
    else:
        violations.zero_()
    if batch == 0:
        return out, violations
    part_max = torch.empty(batch, num_heads, num_parts, dtype=torch.float32, device=q.device)
    part_sum = torch.empty_like(part_max)
    part_acc = torch.empty(batch, num_heads, num_parts, head_dim, dtype=torch.float32, device=q.device)
    head_dim_pad = triton.next_power_of_2(head_dim)
    _decode_partition_kernel[(batch, num_kv_heads, num_parts)](
        q, k_cache, v_cache, block_table, expected_tags, seq_lens, token_writer,
        page_keys if keyed else token_writer, expected_keys if keyed else expected_tags,  # unread unless KEYED
        part_max, part_sum, part_acc, violations,
        scale * math.log2(math.e), num_pool_pages, table_width, num_parts,
        *q.stride(), *k_cache.stride(), *v_cache.stride(),
        *block_table.stride(), *expected_tags.stride(),
        PAGE_SIZE=page_size, GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim, HEAD_DIM_PAD=max(16, head_dim_pad),
        PARTITION=partition_size, BLOCK_N=min(_MAX_BLOCK_N, partition_size),
        CHECK_TAGS=check_tags, KEYED=keyed and check_tags,
        # float32 in, float32 math: keep GPU tl.dot off TF32; other dtypes take the default
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else None,
        enable_fp_fusion=_FP_FUSION,
    )
    _merge_partitions_kernel[(batch, num_heads)](
        part_max, part_sum, part_acc, seq_lens, out,
        table_width, num_parts, *out.stride(),
        PAGE_SIZE=page_size, HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, PARTITION=partition_size,
        MERGE_CHUNK=MERGE_CHUNK,  # one binary for every context length
        enable_fp_fusion=_FP_FUSION,
    )
    return out, violations
