"""The Triton block digest against the torch reference, bit for bit: on the GPU where there is
one, else under the interpreter (tiny shapes: it runs each program in Python)."""

from __future__ import annotations

import os
import re
import secrets

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of the kernel module

import pytest  # noqa: E402

pytest.importorskip("triton")

from kernels import block_digest_ref  # noqa: E402
from kernels.block_digest_layout import byte_rows, word_rows  # noqa: E402
from kernels.block_digest_triton import _digest_words_kernel, block_digest  # noqa: E402
from tests.kernels.block_digest_cases import (  # noqa: E402
    DTYPES,
    LAYOUTS,
    flip_bit,
    make_blocks,
    make_entries,
    row_bytes,
)
from tests.kernels.test_block_digest import BAD_ENTRIES  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def seeded():
    seed = secrets.randbits(31)
    return torch.Generator().manual_seed(seed), f"(seed {seed})"


def reference(blocks, ids, valid) -> list[int]:
    return block_digest_ref.block_digest(blocks.cpu(), ids.cpu(), valid.cpu()).tolist()


def on_device(blocks: torch.Tensor) -> torch.Tensor:
    """The same view (strides and offset kept) over a copy of its storage on DEVICE."""
    if DEVICE == "cpu":
        return blocks
    base = torch.empty(0, dtype=blocks.dtype).set_(blocks.untyped_storage())
    return base.to(DEVICE).as_strided(blocks.shape, blocks.stride(), blocks.storage_offset())


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_triton_matches_reference_bit_for_bit(seeded, layout, block_size, dtype):
    gen, seed = seeded
    blocks = on_device(make_blocks(gen, layout, DTYPES[dtype], block_size, num_blocks=4))
    ids, valid = make_entries(gen, 4, block_size, n=6)
    got = block_digest(blocks, ids, valid)
    assert got.dtype == torch.uint64 and got.device.type == DEVICE
    assert got.cpu().tolist() == reference(blocks, ids, valid), seed


@pytest.mark.parametrize("layout", ["pool", "odd rows"])
def test_triton_sees_a_changed_byte_in_a_valid_row_and_not_past_valid(seeded, layout):
    gen, seed = seeded
    blocks = make_blocks(gen, layout, torch.bfloat16, 16, num_blocks=3)
    ids, valid = torch.tensor([1, 1]), torch.tensor([6, 16], dtype=torch.int32)
    before = block_digest(on_device(blocks), ids, valid).tolist()
    for row, changes in ((5, [True, True]), (6, [False, True])):
        byte = int(torch.randint(0, row_bytes(blocks), (1,), generator=gen))
        flip_bit(blocks, 1, row, byte, 3)
        after = block_digest(on_device(blocks), ids, valid).tolist()
        assert [a != b for a, b in zip(after, before)] == changes, (row, byte, seed)
        flip_bit(blocks, 1, row, byte, 3)
    swapped = blocks.clone()
    swapped[1, 0], swapped[1, 5] = blocks[1, 5], blocks[1, 0]
    assert block_digest(on_device(swapped), ids, valid).tolist()[0] != before[0], seed


@pytest.mark.parametrize("ids,valid,message", BAD_ENTRIES)
def test_triton_refuses_bad_entries_before_launching(ids, valid, message):
    blocks = on_device(make_blocks(torch.Generator().manual_seed(0), "pool", torch.bfloat16, 16))
    with pytest.raises(ValueError, match=re.escape(message)):
        block_digest(blocks, torch.tensor(ids), torch.tensor(valid, dtype=torch.int32))


def test_triton_kernel_reads_nothing_for_an_entry_it_was_never_meant_to_get(seeded):
    """Launched without the launcher's checks, a bad entry digests to 0 instead of reading
    outside the view (the interpreter would return garbage for such a load, silently)."""
    gen, seed = seeded
    blocks = on_device(make_blocks(gen, "contiguous", torch.float32, 16, num_blocks=3))
    words = word_rows(byte_rows(blocks))
    ids = torch.tensor([1, 3, -1, 2, 0], device=DEVICE)
    valid = torch.tensor([16, 16, 4, 17, 5], dtype=torch.int32, device=DEVICE)
    out = torch.zeros(5, dtype=torch.int64, device=DEVICE)
    _digest_words_kernel[(5, 1)](words, ids, valid, out, 3, 16, *words.stride()[:3], 1, words.shape[3],
                                 ROWS=16, CHUNKS=8)
    got = out.view(torch.uint64).cpu().tolist()
    want = reference(blocks, torch.tensor([1, 0]), torch.tensor([16, 5], dtype=torch.int32))
    assert got == [want[0], 0, 0, 0, want[1]], seed
