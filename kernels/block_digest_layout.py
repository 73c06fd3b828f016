"""How the digest kernels see a block view: rows of S segments of L contiguous bytes.

kernels.block_digest_ref defines the digest over the logical bytes of blocks[b, r] for any
view. The kernels read memory in place instead of copying, so they take the view as
uint8 [num_blocks, rows, segments, segment_bytes] with unit stride in the last dim and any
strides elsewhere. That covers the layouts KV caches use without a copy:

- a row contiguous in memory (one segment): a page-major pool's per-layer K, data[:, layer, 0];
  vLLM's FlashAttention cache [2, num_blocks, block_size, heads, dim] as kv[0] or kv[1];
- K and V of a block in one call: kv.permute(1, 2, 0, 3, 4) of that same cache is
  [num_blocks, block_size, 2, heads, dim], two segments (K's row, then V's) per row;
- head-major blocks [num_blocks, heads, block_size, dim] as .transpose(1, 2): `heads` segments.

A row that is not S runs at one stride (e.g. its innermost dim is not unit-stride) gets
None here; the dispatcher then copies the selected blocks first (same digest, one copy).
"""

from __future__ import annotations

import torch


def byte_rows(blocks: torch.Tensor) -> torch.Tensor | None:
    """uint8 [num_blocks, rows, segments, segment_bytes] over blocks' own memory (no copy), in
    the same logical byte order; None when a row is not segments of contiguous bytes at one stride."""
    size = blocks.element_size()
    runs: list[list[int]] = []  # [count, stride in elements] of the row's dims, merged where contiguous
    for count, stride in zip(blocks.shape[2:], blocks.stride()[2:]):
        if count == 1:
            continue
        if runs and runs[-1][1] == count * stride:
            runs[-1] = [runs[-1][0] * count, stride]
        else:
            runs.append([count, stride])
    if not runs or runs[-1][1] != 1:
        runs.append([1, 1])  # each element (or the whole, empty row) is its own run
    if len(runs) > 2:
        return None
    segments, segment_stride = runs[0] if len(runs) == 2 else (1, 0)
    segment_bytes = runs[-1][0] * size
    if segments * segment_bytes == 0:  # an empty row: nothing to read
        segments, segment_bytes = 1, 0
    flat = torch.empty(0, dtype=torch.uint8, device=blocks.device).set_(blocks.untyped_storage())
    return flat.as_strided(
        (blocks.shape[0], blocks.shape[1], segments, segment_bytes),
        (blocks.stride(0) * size, blocks.stride(1) * size, segment_stride * size, 1),
        blocks.storage_offset() * size,
    )


def word_rows(rows: torch.Tensor) -> torch.Tensor | None:
    """The byte view as int64 [num_blocks, rows, segments, segment_bytes / 8] where every
    segment starts on an 8-byte boundary and is whole chunks (so a chunk never spans two
    segments and loads are aligned); None otherwise."""
    offset = rows.storage_offset()
    strides = (*rows.stride()[:3], rows.shape[3], offset, rows.untyped_storage().data_ptr())
    if any(value % 8 for value in strides):
        return None
    storage = rows.untyped_storage()
    flat = torch.empty(0, dtype=torch.uint8, device=rows.device).set_(storage)
    words = flat[: storage.nbytes() // 8 * 8].view(torch.int64)
    return words.as_strided((*rows.shape[:3], rows.shape[3] // 8), tuple(s // 8 for s in rows.stride()[:3]) + (1,),
                            offset // 8)
