"""A 64-bit digest per KV block over exactly the rows that count: the torch reference.

The definition (the C++ and Triton kernels reproduce it bit for bit):

- `blocks` is any tensor whose dim 0 indexes blocks and dim 1 the token row within a block;
  whatever follows is one row, read in logical (C) order as raw bytes, whatever the dtype.
  The digest is of the logical content: the same values under another memory layout (a
  transposed view, K and V in one pool or two) give the same digest.
- Each row's bytes are zero-padded to a multiple of 8 and read as little-endian uint64
  chunks: chunk c of row r sits at position p = r * chunks_per_row + c. The padding is
  unambiguous because every row of a view has the same size.
- A chunk x at position p adds mix(x XOR (p + 1) * GAMMA) to the digest, mod 2^64, where
  mix is splitmix64's finalizer and GAMMA its increment (so a zero chunk adds splitmix64's
  p-th output). Only rows r < valid_rows count; zero rows digest to 0.

Why this hash: each term depends only on its chunk and position, so any order of summing
(threads, atomics, SIMD lanes) gives the same bits, and the sum runs at memory speed. 64-bit
chunks halve the mixing per byte against 32-bit words (on a GPU the 64-bit multiplies, not
the loads, would bound a per-word mix). mix is a bijection and x -> x XOR key(p) is too, so a
change confined to one chunk always changes the digest; anything else (rows swapped, shifted,
stale or zeroed) is caught unless the sums collide by chance, about 2^-64 for unrelated content.

What it does not catch: it is not cryptographic and has no key, so whoever controls the KV
bytes can forge a matching block; two different blocks can collide (rarely, as above); a
write that lands after the digest was taken (a late transfer) is unseen by that digest; and
it checks transport, not meaning: if both sides digest the same wrong bytes, it matches.
"""

from __future__ import annotations

import math
import sys

import torch

GAMMA = 0x9E3779B97F4A7C15
MIX_MUL_1 = 0xBF58476D1CE4E5B9
MIX_MUL_2 = 0x94D049BB133111EB
_U64 = (1 << 64) - 1


def _signed(value: int) -> int:
    """A uint64 constant as the int64 torch multiplies with (same bits)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def validate_digest_inputs(blocks: torch.Tensor, block_ids: torch.Tensor, valid_rows: torch.Tensor):
    """Checks shared by the three implementations, before any block is read.

    Returns (block_ids as int64, valid_rows as int32), both on blocks' device. The check runs
    where the entries are: given on the CPU (vLLM's block ids are host lists) for blocks on a
    GPU, it needs no host sync, and the entries go over as a private pinned copy without
    waiting; given on the GPU, it costs one sync. Raises ValueError naming the first bad entry:
    a block id outside [0, num_blocks), valid rows outside [0, rows per block], shapes that
    disagree, or a non-integer index tensor.
    """
    if blocks.dim() < 2:
        raise ValueError(f"blocks must be [num_blocks, rows, ...], got shape {tuple(blocks.shape)}")
    for name, t in (("block_ids", block_ids), ("valid_rows", valid_rows)):
        if t.dim() != 1 or t.dtype.is_floating_point or t.dtype.is_complex or t.dtype is torch.bool:
            raise ValueError(f"{name} must be a 1-D integer tensor, got {t.dtype} of shape {tuple(t.shape)}")
    if block_ids.shape != valid_rows.shape:
        raise ValueError(f"block_ids has {block_ids.numel()} entries but valid_rows has {valid_rows.numel()}")
    ids, valid = block_ids.to(torch.int64), valid_rows.to(torch.int32)
    num_blocks, rows = blocks.shape[0], blocks.shape[1]
    bad = (ids < 0) | (ids >= num_blocks) | (valid < 0) | (valid > rows)
    if ids.numel() and bool(bad.any()):  # one host sync, for a message that names the entry
        i = int(bad.nonzero()[0, 0])
        block, count = int(ids[i]), int(valid[i])
        if not 0 <= block < num_blocks:
            raise ValueError(f"block_ids[{i}] = {block} is out of range for {num_blocks} blocks")
        raise ValueError(f"valid_rows[{i}] = {count} is outside [0, {rows}] (rows per block) for block {block}")
    return _to(ids, blocks.device), _to(valid, blocks.device)


def _to(entries: torch.Tensor, device: torch.device) -> torch.Tensor:
    if entries.device == device:
        return entries
    if entries.device.type == "cpu" and device.type == "cuda":
        # private, so a caller reusing its tensor cannot race the copy still in flight
        pinned = torch.empty(entries.shape, dtype=entries.dtype, pin_memory=True).copy_(entries)
        return pinned.to(device, non_blocking=True)
    return entries.to(device)


def block_digest(blocks: torch.Tensor, block_ids: torch.Tensor, valid_rows: torch.Tensor) -> torch.Tensor:
    """uint64[n]: the digest of blocks[block_ids[i], :valid_rows[i]] for each i (module docstring).

    Raises ValueError as validate_digest_inputs does; nothing is read before the checks pass.
    """
    if sys.byteorder != "little":
        raise RuntimeError("the digest is defined on little-endian bytes; this host is big-endian")
    ids, valid = validate_digest_inputs(blocks, block_ids, valid_rows)
    chunks = row_chunks(blocks.index_select(0, ids))  # int64 [n, rows, chunks_per_row]
    n, rows, per_row = chunks.shape
    positions = torch.arange(rows * per_row, dtype=torch.int64, device=blocks.device).view(rows, per_row)
    # torch's int64 arithmetic wraps mod 2^64 (tests hold this to a plain-Python oracle)
    terms = _mix(chunks ^ ((positions + 1) * _signed(GAMMA)))
    counted = torch.arange(rows, device=blocks.device)[None, :] < valid[:, None].long()
    terms = torch.where(counted[:, :, None], terms, 0)
    return terms.sum(dim=(1, 2), dtype=torch.int64).view(torch.uint64)


def row_chunks(blocks: torch.Tensor) -> torch.Tensor:
    """int64 [num_blocks, rows, chunks_per_row]: each row's bytes in logical order, zero-padded
    to a multiple of 8 and read as little-endian 64-bit chunks (a copy)."""
    num_blocks, rows = blocks.shape[0], blocks.shape[1]
    row_bytes = math.prod(blocks.shape[2:]) * blocks.element_size()
    per_row = -(-row_bytes // 8)
    if num_blocks * rows * per_row == 0:
        return torch.zeros(num_blocks, rows, per_row, dtype=torch.int64, device=blocks.device)
    raw = blocks.contiguous().view(-1).view(torch.uint8).view(num_blocks, rows, row_bytes)
    if row_bytes % 8:
        raw = torch.cat([raw, raw.new_zeros(num_blocks, rows, 8 * per_row - row_bytes)], dim=2)
    return raw.view(torch.int64)


def _mix(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's finalizer on int64 bits (logical shifts done by masking)."""
    z = z ^ _shr(z, 30)
    z = z * _signed(MIX_MUL_1)
    z = z ^ _shr(z, 27)
    z = z * _signed(MIX_MUL_2)
    return z ^ _shr(z, 31)


def _shr(z: torch.Tensor, bits: int) -> torch.Tensor:
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def digest_of_rows(rows: list[bytes]) -> int:
    """The definition in plain Python, one block's counted rows (all the same length): the
    oracle that the torch reference is held to."""
    total = 0
    for r, row in enumerate(rows):
        row = row + bytes(-len(row) % 8)
        per_row = len(row) // 8
        for c in range(per_row):
            x = int.from_bytes(row[8 * c: 8 * c + 8], "little")
            z = (x ^ ((r * per_row + c + 1) * GAMMA)) & _U64
            z = ((z ^ (z >> 30)) * MIX_MUL_1) & _U64
            z = ((z ^ (z >> 27)) * MIX_MUL_2) & _U64
            total = (total + (z ^ (z >> 31))) & _U64
    return total
