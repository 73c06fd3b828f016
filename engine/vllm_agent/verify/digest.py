"""Block digests over vLLM's paged KV cache, one 64-bit value per block position over all layers.

A digest covers the token rows a block holds (a partial last block: only its first `rows`
tokens, so that whatever the rest of the block held before cannot change it), in every layer,
combined in layer-name order. The producer digests blocks as it computes them; the consumer
digests the same positions after its inner connector says the load finished. Equal bytes give
equal digests on both sides; which bytes a block holds is all it says (not which model, not
whether the producer computed them right).

Layouts: vLLM's CPU attention keeps a layer as [blocks, kv_heads, block_size, 2 * head_size]
(keys in the first block_size "rows" of each head's [2 * block_size, head_size] view, values
after); the CUDA flash layout is [2, blocks, block_size, kv_heads, head_size]. Both are
gathered to [n, block_size, row_elems] token rows. Other layouts are digested whole-block:
full blocks only.

`block_digest` is the one function that turns rows into digests: a torch reference here,
swapped for the CPU module / Triton kernels' dispatcher when those land.

torch only (no vLLM).
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch


def block_digest(blocks: torch.Tensor, block_ids: torch.Tensor, valid_rows: torch.Tensor) -> np.ndarray:
    """uint64[n]: a digest of blocks[block_ids[i], :valid_rows[i]] (bytes and row count) each.
    blocks: [num_blocks, rows, row_elems], any dtype, contiguous."""
    out = np.zeros(len(block_ids), dtype=np.uint64)
    host = blocks.detach().cpu()
    for i, (b, r) in enumerate(zip(block_ids.tolist(), valid_rows.tolist())):
        h = hashlib.blake2b(host[b, :r].contiguous().view(torch.uint8).numpy().tobytes(), digest_size=8,
                            person=r.to_bytes(8, "little"))
        out[i] = int.from_bytes(h.digest(), "little")
    return out


def token_rows(kv_layer: torch.Tensor, block_ids: list[int], block_size: int) -> torch.Tensor | None:
    """The blocks' token rows as [n, block_size, row_elems] (a copy of those blocks only), or
    None for a layout this does not know."""
    index = torch.as_tensor(block_ids, dtype=torch.long, device=kv_layer.device)
    if kv_layer.dim() == 4 and kv_layer.shape[2] == block_size and kv_layer.shape[3] % 2 == 0:  # CPU
        n, heads, head2 = len(block_ids), kv_layer.shape[1], kv_layer.shape[3]
        picked = kv_layer.index_select(0, index).view(n, heads, 2, block_size, head2 // 2)
        return picked.permute(0, 3, 1, 2, 4).reshape(n, block_size, -1)
    if kv_layer.dim() == 5 and kv_layer.shape[0] == 2 and kv_layer.shape[2] == block_size:  # flash
        picked = kv_layer.index_select(1, index)
        return picked.permute(1, 2, 0, 3, 4).reshape(len(block_ids), block_size, -1)
    return None


def layer_digests(kv_layer: torch.Tensor, block_ids: list[int], rows: list[int],
                  block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(uint64 per block of one layer, whether it could be digested). An unknown layout is
    digested whole-block: its partial blocks cannot be, and say so."""
    ok = np.ones(len(block_ids), dtype=bool)
    if not block_ids:
        return np.zeros(0, dtype=np.uint64), ok
    view = token_rows(kv_layer, block_ids, block_size)
    if view is None:
        whole = kv_layer.index_select(0, torch.as_tensor(block_ids, device=kv_layer.device))
        ok = np.asarray(rows) == block_size
        out = block_digest(whole.reshape(len(block_ids), 1, -1).contiguous(), torch.arange(len(block_ids)),
                           torch.ones(len(block_ids), dtype=torch.long))
        return out, ok
    return block_digest(view.contiguous(), torch.arange(len(block_ids)), torch.as_tensor(rows)), ok


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
