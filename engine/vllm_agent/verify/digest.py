"""Block digests over vLLM's paged KV cache, one 64-bit value per block position over all layers.

A digest covers the token rows a block holds (a partial last block: only its first `rows`
tokens, so that whatever the rest of the block held before cannot change it), in every layer,
combined in layer-name order. The producer digests blocks as it computes them; the consumer
digests the same positions after its inner connector says the load finished. Equal bytes give
equal digests on both sides; which bytes a block holds is all it says (not which model, not
whether the producer computed them right).

Layouts: vLLM's CPU attention keeps a layer as [blocks, kv_heads, block_size, 2 * head_size]
(keys in the first block_size "rows" of each head's [2 * block_size, head_size] view, values
after); the CUDA flash layout is [2, blocks, block_size, kv_heads, head_size]. Both are viewed
in place as [blocks, block_size, 2, kv_heads, head_size] token rows, so the two layouts digest
the same tokens alike. Other layouts are digested whole-block: full
blocks only.

The digest itself is kernels.block_digest (the C++ module on CPU, Triton on CUDA, the torch
reference elsewhere), reading the blocks in place.

torch only (no vLLM).
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from kernels.block_digest import block_digest


def token_rows(kv_layer: torch.Tensor, block_size: int) -> torch.Tensor | None:
    """The whole layer as [num_blocks, block_size, ...] token rows, a view (no copy), or None
    for a layout this does not know."""
    if kv_layer.dim() == 4 and kv_layer.shape[2] == block_size and kv_layer.shape[3] % 2 == 0:  # CPU
        blocks, heads, head2 = kv_layer.shape[0], kv_layer.shape[1], kv_layer.shape[3]
        # rows as [2, heads, head] (K then V), as the flash layout's: either side may run either
        return kv_layer.view(blocks, heads, 2, block_size, head2 // 2).permute(0, 3, 2, 1, 4)
    if kv_layer.dim() == 5 and kv_layer.shape[0] == 2 and kv_layer.shape[2] == block_size:  # flash
        return kv_layer.permute(1, 2, 0, 3, 4)
    return None


def _u64(digests: torch.Tensor) -> np.ndarray:
    return np.asarray(digests.view(torch.int64).cpu().tolist(), dtype=np.int64).view(np.uint64)


def layer_digests(kv_layer: torch.Tensor, block_ids: list[int], rows: list[int],
                  block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(uint64 per block of one layer, whether it could be digested). An unknown layout is
    digested whole-block: its partial blocks cannot be, and say so."""
    ok = np.ones(len(block_ids), dtype=bool)
    if not block_ids:
        return np.zeros(0, dtype=np.uint64), ok
    ids = torch.as_tensor(block_ids, dtype=torch.int64, device=kv_layer.device)
    view = token_rows(kv_layer, block_size)
    if view is None:
        ok = np.asarray(rows) == block_size
        whole = kv_layer.reshape(kv_layer.shape[0], 1, -1)
        return _u64(block_digest(whole, ids, torch.ones_like(ids))), ok
    return _u64(block_digest(view, ids, torch.as_tensor(rows, dtype=torch.int64, device=kv_layer.device))), ok


def combine(per_layer: list[tuple[str, np.ndarray]]) -> np.ndarray:
    """One digest per block over all layers, in layer-name order (the same on both sides)."""
    ordered = [d for _, d in sorted(per_layer, key=lambda item: item[0])]
    if not ordered:
        return np.zeros(0, dtype=np.uint64)
    stacked = np.stack(ordered, axis=1).astype("<u8")
    return np.array([int.from_bytes(hashlib.blake2b(row.tobytes(), digest_size=8).digest(), "little")
                     for row in stacked], dtype=np.uint64)


def digest_blocks(layers: dict[str, torch.Tensor], block_ids: list[int], rows: list[int],
                  block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(one digest per block over all layers, whether every layer could digest it: a block
    that could not be digested is never reported as verified)."""
    per_layer, ok = [], np.ones(len(block_ids), dtype=bool)
    for name, kv in layers.items():
        d, good = layer_digests(kv, block_ids, rows, block_size)
        per_layer.append((name, d))
        ok &= good
    return combine(per_layer), ok


def copy_blocks(layers: dict[str, torch.Tensor], block_ids: list[int]) -> dict[str, torch.Tensor]:
    """The blocks' bytes in every layer (the test fault puts them back after a load)."""
    return {name: _blocks_of(kv, block_ids).clone() for name, kv in layers.items()}


def put_blocks(layers: dict[str, torch.Tensor], block_ids: list[int], saved: dict[str, torch.Tensor]) -> None:
    for name, kv in layers.items():
        _write_blocks(kv, block_ids, saved[name])


def scrub_blocks(layers: dict[str, torch.Tensor], block_ids: list[int]) -> None:
    """Zero blocks that failed their check, so that even the one forward vLLM runs before it
    discards the step's output reads zeros, not another request's data."""
    for kv in layers.values():
        _write_blocks(kv, block_ids, None)


def _flash(kv: torch.Tensor) -> bool:
    return kv.dim() == 5 and kv.shape[0] == 2


def _blocks_of(kv: torch.Tensor, block_ids: list[int]) -> torch.Tensor:
    index = torch.as_tensor(block_ids, dtype=torch.long, device=kv.device)
    return kv.index_select(1 if _flash(kv) else 0, index)


def _write_blocks(kv: torch.Tensor, block_ids: list[int], values: torch.Tensor | None) -> None:
    index = torch.as_tensor(block_ids, dtype=torch.long, device=kv.device)
    dim = 1 if _flash(kv) else 0
    if values is None:
        kv.index_fill_(dim, index, 0)
    else:
        kv.index_copy_(dim, index, values)
