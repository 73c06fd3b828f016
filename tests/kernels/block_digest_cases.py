"""Block views for the digest tests: random bits (every byte pattern, NaNs included) in the
layouts KV caches use, and the entries (block ids, ragged valid rows) to digest them by."""

from __future__ import annotations

import torch

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

# name: what the view is, and which read the kernels take (kernels/block_digest_layout.py)
LAYOUTS = {
    "contiguous": "[blocks, rows, heads, dim], rows whole chunks: 64-bit loads",
    "pool": "one layer's K of a page-major pool [pages, layers, 2, rows, heads, dim]: strided blocks",
    "k+v": "vLLM's [2, blocks, rows, heads, dim] permuted so a row is K's then V's: two segments",
    "head-major": "[blocks, heads, rows, dim].transpose(1, 2): `heads` segments per row",
    "odd rows": "head dim cut to dim - 1: segments that are not whole chunks, read byte by byte",
    "tiny rows": "three elements a row (6 or 12 bytes): one padded chunk or two",
    "copied": "innermost dim not unit-stride: the selected blocks are copied first",
}


def random_bits(gen: torch.Generator, shape, dtype: torch.dtype) -> torch.Tensor:
    """A tensor of `dtype` whose bytes are uniformly random."""
    size = torch.empty(0, dtype=dtype).element_size()
    ints = _BITS[size]
    info = torch.iinfo(ints)
    return torch.randint(info.min, info.max, shape, generator=gen, dtype=ints).view(dtype)


def make_blocks(gen, layout: str, dtype: torch.dtype, block_size: int, *, num_blocks=6, heads=2, dim=8):
    """A view [num_blocks, block_size, ...] of `layout` (LAYOUTS) over random bits."""
    def bits(*shape):
        return random_bits(gen, shape, dtype)

    if layout == "contiguous":
        return bits(num_blocks, block_size, heads, dim)
    if layout == "pool":
        return bits(num_blocks, 2, 2, block_size, heads, dim)[:, 1, 0]
    if layout == "k+v":
        return bits(2, num_blocks, block_size, heads, dim).permute(1, 2, 0, 3, 4)
    if layout == "head-major":
        return bits(num_blocks, heads, block_size, dim).transpose(1, 2)
    if layout == "odd rows":
        return bits(num_blocks, block_size, heads, dim)[..., : dim - 1]
    if layout == "tiny rows":
        return bits(num_blocks, block_size, 3)
    if layout == "copied":
        return bits(num_blocks, block_size, dim, heads).transpose(2, 3)
    raise ValueError(f"unknown layout {layout!r}")


def make_entries(gen, num_blocks: int, block_size: int, n: int = 8):
    """block_ids (repeats allowed) and ragged valid_rows that include 0 and a full block."""
    ids = torch.randint(0, num_blocks, (n,), generator=gen, dtype=torch.int64)
    valid = torch.randint(0, block_size + 1, (n,), generator=gen, dtype=torch.int32)
    valid[0], valid[-1] = 0, block_size
    if n > 2:
        valid[1] = 1
    return ids, valid


def flip_bit(blocks: torch.Tensor, block: int, row: int, byte: int, bit: int) -> None:
    """Flip one bit of byte `byte` (in logical order) of blocks[block, row], in place."""
    size = blocks.element_size()
    element, within = divmod(byte, size)
    ints = blocks.view(_BITS[size])  # same element size: allowed for any strides
    index = (block, row, *torch.unravel_index(torch.tensor(element), blocks.shape[2:]))
    shift = 8 * within + bit
    mask = -(1 << shift) if shift == 8 * size - 1 else 1 << shift  # the sign bit, as the signed int it is
    ints[tuple(int(i) for i in index)] ^= mask


def row_bytes(blocks: torch.Tensor) -> int:
    return blocks[0, 0].numel() * blocks.element_size()
