"""The KV block digest where the KV lives: Triton on CUDA, the C++ module on the CPU, else the
torch reference. The definition, and what the digest does and does not catch, are in
kernels/block_digest_ref.py; the views it reads in place, in kernels/block_digest_layout.py.

    digest = block_digest(k_cache, block_ids, valid_rows)  # uint64[n]

For K and V of vLLM's FlashAttention cache [2, num_blocks, block_size, heads, dim] in one
call, pass kv_cache.permute(1, 2, 0, 3, 4); for head-major blocks [num_blocks, heads,
block_size, dim], pass .transpose(1, 2). Equal logical content gives equal digests across
layouts and devices, so a producer and a consumer with different layouts still agree.
"""

from __future__ import annotations

import torch

from kernels import block_digest_ref, cpu_extension
from kernels.block_digest_layout import byte_rows
from kernels.block_digest_ref import validate_digest_inputs


def block_digest(blocks: torch.Tensor, block_ids: torch.Tensor, valid_rows: torch.Tensor) -> torch.Tensor:
    """uint64[n] on blocks' device: the digest of blocks[block_ids[i], :valid_rows[i]].

    blocks: [num_blocks, rows, ...] of any dtype and strides; block_ids and valid_rows: 1-D
    integer tensors of one length n (converted to int64 / int32 on blocks' device). Raises
    ValueError naming the first block id outside [0, num_blocks) or valid rows outside
    [0, rows], before any block is read.
    """
    backend = digest_backend(blocks.device)
    if backend == "triton":
        from kernels.block_digest_triton import block_digest as triton_digest

        return triton_digest(blocks, block_ids, valid_rows)
    if backend == "C++":
        return _cpu_digest(blocks, block_ids, valid_rows)
    return block_digest_ref.block_digest(blocks, block_ids, valid_rows)


def digest_backend(device) -> str:
    """What block_digest runs on for `device`: "triton" (CUDA), "C++" (the CPU module, where it
    builds and PAGEWARDEN_CPU_KERNELS is not "reference") or "torch" (the reference)."""
    device = torch.device(device)
    if device.type == "cuda":
        return "triton"
    if device.type == "cpu" and cpu_extension.extension() is not None:
        return "C++"
    return "torch"


def _cpu_digest(blocks, block_ids, valid_rows) -> torch.Tensor:
    ids, valid = validate_digest_inputs(blocks, block_ids, valid_rows)
    rows = byte_rows(blocks)
    if rows is None:  # a row the kernel cannot read in place: copy the selected blocks
        blocks = blocks.index_select(0, ids)
        ids = torch.arange(ids.numel(), dtype=torch.int64)
        rows = byte_rows(blocks)
    return cpu_extension.extension().block_digest(rows, ids, valid)
