"""Write new K/V tokens into their pages and stamp writer tags, in Triton (one program per token)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.kv_store_ref import validate_store_inputs

# pinned: Triton 3.9 warns when it is left to the default (and the default is about to change)
_FP_FUSION = True


@triton.jit
def _store_kv_kernel(
    k_cache_ptr, v_cache_ptr, k_new_ptr, v_new_ptr, slot_mapping_ptr, writer_tags_ptr,
    writer_ptr, filled_ptr, token_writer_ptr,
    stride_kp, stride_ks, stride_kh, stride_kd,
    stride_vp, stride_vs, stride_vh, stride_vd,
    stride_knt, stride_knh, stride_knd, stride_vnt, stride_vnh, stride_vnd,
    PAGE_SIZE: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, STAMP: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + t)
    keep = slot >= 0
    page = slot // PAGE_SIZE
    offset = slot % PAGE_SIZE
    h = tl.arange(0, HEADS_PAD)
    d = tl.arange(0, HEAD_DIM_PAD)
    # slot is broadcast before comparing: the interpreter miscasts a broadcast scalar bool
    keep_hd = (slot + tl.zeros([HEADS_PAD, HEAD_DIM_PAD], tl.int64)) >= 0
    mask = keep_hd & (h[:, None] < NUM_KV_HEADS) & (d[None, :] < HEAD_DIM)
    k = tl.load(k_new_ptr + t * stride_knt + h[:, None] * stride_knh + d[None, :] * stride_knd, mask=mask)
    v = tl.load(v_new_ptr + t * stride_vnt + h[:, None] * stride_vnh + d[None, :] * stride_vnd, mask=mask)
    k_dst = k_cache_ptr + page * stride_kp + offset * stride_ks + h[:, None] * stride_kh + d[None, :] * stride_kd
    v_dst = v_cache_ptr + page * stride_vp + offset * stride_vs + h[:, None] * stride_vh + d[None, :] * stride_vd
    tl.store(k_dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)
    if STAMP:
        tag = tl.load(writer_tags_ptr + t)
        tl.store(token_writer_ptr + slot, tag, mask=keep)  # I1 reads this one
        tl.store(writer_ptr + page, tag, mask=keep)  # the page's last writer, for telemetry
        # filled counts the token slots written this epoch: a gap (a slot never written
        # before a later one) leaves it short of what a reader needs, so I1 sees the gap
        tl.atomic_add(filled_ptr + page, (offset * 0 + 1).to(tl.int32), mask=keep)


def store_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    slot_mapping: torch.Tensor,
    writer_tags: torch.Tensor,
    writer: torch.Tensor,
    filled: torch.Tensor,
    token_writer: torch.Tensor,
    stamp: bool = True,
) -> None:
    """Store token t's K/V at slot_mapping[t] = page * page_size + offset (negative: skip it).

    With stamp (once per forward pass): token_writer[page, offset] = writer[page] =
    writer_tags[t] and filled[page] += 1 for every token written into it.
    Raises ValueError on inconsistent shapes.
    """
    validate_store_inputs(k_cache, v_cache, k_new, v_new, slot_mapping, writer_tags)
    tokens = k_new.shape[0]
    if tokens == 0:
        return
    _, page_size, num_kv_heads, head_dim = k_cache.shape
    _store_kv_kernel[(tokens,)](
        k_cache, v_cache, k_new, v_new, slot_mapping, writer_tags, writer, filled, token_writer,
        *k_cache.stride(), *v_cache.stride(), *k_new.stride(), *v_new.stride(),
        PAGE_SIZE=page_size, NUM_KV_HEADS=num_kv_heads,
        HEADS_PAD=triton.next_power_of_2(num_kv_heads),
        HEAD_DIM=head_dim, HEAD_DIM_PAD=triton.next_power_of_2(head_dim), STAMP=stamp,
        enable_fp_fusion=_FP_FUSION,
    )
