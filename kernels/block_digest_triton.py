"""The KV block digest in Triton (the definition: kernels/block_digest_ref.py).

One program per (block, tile of rows); each sums its terms and adds them to the block's
digest with an atomic add. Addition mod 2^64 is order-free, so the result is the same bits
however the programs interleave. Blocks are read in place through the layout of
kernels/block_digest_layout.py: whole 64-bit chunks where every segment is 8-byte aligned
(KV caches are), byte by byte otherwise.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.block_digest_layout import byte_rows, word_rows
from kernels.block_digest_ref import validate_digest_inputs

_TILE = 1024  # chunks per program and loop step: rows x chunks
_MAX_CHUNKS = 512
_BYTE_CHUNKS = 64
_NUM_WARPS = 4
# integers only; pinned because Triton 3.9 warns when it is left to the default
_FP_FUSION = False


@triton.jit
def _term(x, p):
    """mix(x XOR (p + 1) * GAMMA) for uint64 chunks x at positions p: splitmix64's finalizer."""
    z = x ^ ((p + 1) * 0x9E3779B97F4A7C15)
    z = z ^ (z >> 30)
    z = z * 0xBF58476D1CE4E5B9
    z = z ^ (z >> 27)
    z = z * 0x94D049BB133111EB
    return z ^ (z >> 31)


@triton.jit
def _checked_entry(ids_ptr, valid_ptr, num_blocks, rows):
    """(block, valid rows) of this program's entry; an entry the launcher should have refused
    reads nothing (valid 0), so no launch can read outside the view."""
    i = tl.program_id(0)
    block = tl.load(ids_ptr + i)
    valid = tl.load(valid_ptr + i)
    ok = (block >= 0) & (block < num_blocks) & (valid >= 0) & (valid <= rows)
    return tl.where(ok, block, 0), tl.where(ok, valid, 0)


@triton.jit
def _digest_words_kernel(words_ptr, ids_ptr, valid_ptr, out_ptr, num_blocks, rows,
                         stride_b, stride_r, stride_s, segments, segment_words,
                         ROWS: tl.constexpr, CHUNKS: tl.constexpr):
    block, valid = _checked_entry(ids_ptr, valid_ptr, num_blocks, rows)
    r = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
    counted = r < valid
    # int64 offsets: a pool of tens of GiB overflows int32 element offsets
    row_ptr = words_ptr + block * stride_b + r.to(tl.int64) * stride_r
    row_pos = r.to(tl.int64) * segments * segment_words
    acc = tl.zeros([ROWS, CHUNKS], dtype=tl.uint64)
    seg_ptr, seg_pos = row_ptr, row_pos
    for _ in range(segments):
        for c0 in range(0, segment_words, CHUNKS):
            c = c0 + tl.arange(0, CHUNKS)
            mask = counted[:, None] & (c < segment_words)[None, :]
            x = tl.load(seg_ptr[:, None] + c[None, :], mask=mask, other=0)
            p = seg_pos[:, None] + c[None, :]
            term = _term(x.to(tl.uint64, bitcast=True), p.to(tl.uint64, bitcast=True))
            acc += tl.where(mask, term, 0)
        seg_ptr += stride_s
        seg_pos += segment_words
    total = tl.sum(tl.sum(acc, axis=1), axis=0)
    tl.atomic_add(out_ptr + tl.program_id(0), total.to(tl.int64, bitcast=True),
                  mask=tl.program_id(1) * ROWS < valid, sem="relaxed")


@triton.jit
def _digest_bytes_kernel(bytes_ptr, ids_ptr, valid_ptr, out_ptr, num_blocks, rows,
                         stride_b, stride_r, stride_s, segment_bytes, row_bytes,
                         ROWS: tl.constexpr, CHUNKS: tl.constexpr):
    block, valid = _checked_entry(ids_ptr, valid_ptr, num_blocks, rows)
    per_row = (row_bytes + 7) // 8
    t = tl.arange(0, 8)
    acc = tl.zeros([CHUNKS], dtype=tl.uint64)
    for i in range(ROWS):
        r = tl.program_id(1) * ROWS + i
        row_ptr = bytes_ptr + block * stride_b + r.to(tl.int64) * stride_r
        limit = tl.where(r < valid, row_bytes, 0)  # a row past valid reads nothing
        for c0 in range(0, per_row, CHUNKS):
            c = c0 + tl.arange(0, CHUNKS)
            k = c[:, None] * 8 + t[None, :]  # byte k of the row, in logical order
            seg = k // segment_bytes
            byte = tl.load(row_ptr + seg.to(tl.int64) * stride_s + (k - seg * segment_bytes),
                           mask=k < limit, other=0)
            x = tl.sum(byte.to(tl.uint64) << (8 * t[None, :]).to(tl.uint64), axis=1)  # little-endian
            p = r.to(tl.int64) * per_row + c
            acc += tl.where(c * 8 < limit, _term(x, p.to(tl.uint64, bitcast=True)), 0)
    tl.atomic_add(out_ptr + tl.program_id(0), tl.sum(acc, axis=0).to(tl.int64, bitcast=True),
                  mask=tl.program_id(1) * ROWS < valid, sem="relaxed")


def block_digest(blocks: torch.Tensor, block_ids: torch.Tensor, valid_rows: torch.Tensor) -> torch.Tensor:
    """uint64[n]: the digest of blocks[block_ids[i], :valid_rows[i]], read in place.

    blocks: any view [num_blocks, rows, ...] (kernels/block_digest_layout.py); a row layout it
    cannot read in place is copied first (the selected blocks only). Raises ValueError naming a
    block id out of range or valid rows outside [0, rows], before anything is launched.
    """
    ids, valid = validate_digest_inputs(blocks, block_ids, valid_rows)
    out = torch.zeros(ids.numel(), dtype=torch.int64, device=blocks.device)
    rows = byte_rows(blocks)
    if rows is None:
        blocks = blocks.index_select(0, ids)
        ids = torch.arange(ids.numel(), dtype=torch.int64, device=blocks.device)
        rows = byte_rows(blocks.contiguous())
    num_blocks, per_block, segments, segment_bytes = rows.shape
    if out.numel() == 0 or per_block == 0 or segment_bytes == 0:
        return out.view(torch.uint64)
    words = word_rows(rows)
    if words is not None:
        chunks = min(triton.next_power_of_2(words.shape[3]), _MAX_CHUNKS)
        tile_rows = min(max(1, _TILE // chunks), triton.next_power_of_2(per_block))
        grid = (ids.numel(), triton.cdiv(per_block, tile_rows))
        _digest_words_kernel[grid](words, ids, valid, out, num_blocks, per_block, *words.stride()[:3],
                                   segments, words.shape[3], ROWS=tile_rows, CHUNKS=chunks, num_warps=_NUM_WARPS,
                                   enable_fp_fusion=_FP_FUSION)
    else:
        tile_rows = min(4, triton.next_power_of_2(per_block))
        grid = (ids.numel(), triton.cdiv(per_block, tile_rows))
        _digest_bytes_kernel[grid](rows, ids, valid, out, num_blocks, per_block, *rows.stride()[:3],
                                   segment_bytes, segments * segment_bytes, ROWS=tile_rows, CHUNKS=_BYTE_CHUNKS,
                                   num_warps=_NUM_WARPS, enable_fp_fusion=_FP_FUSION)
    return out.view(torch.uint64)
