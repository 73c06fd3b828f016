"""The KV block digest: the torch reference against the definition in plain Python, the C++
kernel against the reference bit for bit, what the digest sees and what it must not, and the
refusals (a block id out of range, valid rows past the block) in each implementation.

The Triton kernel is held to the same reference in test_block_digest_triton.py.
"""

from __future__ import annotations

import re
import secrets

import pytest
import torch

from kernels import block_digest_ref, cpu_extension
from kernels.block_digest import block_digest, digest_backend
from kernels.block_digest_layout import byte_rows, word_rows
from kernels.block_digest_ref import digest_of_rows
from tests.kernels.block_digest_cases import DTYPES, LAYOUTS, flip_bit, make_blocks, make_entries, row_bytes


@pytest.fixture
def seeded():
    """A generator with a fresh seed; the seed is in every assertion message."""
    seed = secrets.randbits(31)
    return torch.Generator().manual_seed(seed), f"(seed {seed})"


@pytest.fixture(scope="module")
def built():
    """The C++ module as the engine gets it (PAGEWARDEN_CPU_KERNELS unset); None where it cannot build."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(cpu_extension.ENV_VAR, raising=False)
        cpu_extension.extension.cache_clear()
        yield cpu_extension.extension()
    cpu_extension.extension.cache_clear()


def cpp_digest(built, blocks, ids, valid):
    if built is None:
        pytest.skip("the C++ module did not build here")
    assert digest_backend("cpu") == "C++"
    return block_digest(blocks, ids, valid)


def python_digest(blocks, ids, valid) -> list[int]:
    """The definition, from each counted row's logical bytes."""
    def raw(row):
        return row.contiguous().view(-1).view(torch.uint8).numpy().tobytes() if row.numel() else b""

    return [digest_of_rows([raw(blocks[b, r]) for r in range(v)]) for b, v in zip(ids.tolist(), valid.tolist())]


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_reference_is_the_definition(seeded, layout, dtype):
    gen, seed = seeded
    blocks = make_blocks(gen, layout, DTYPES[dtype], 4, num_blocks=3)
    ids, valid = make_entries(gen, 3, 4, n=4)
    assert block_digest_ref.block_digest(blocks, ids, valid).tolist() == python_digest(blocks, ids, valid), seed


def test_reference_on_a_two_dim_view_and_odd_byte_rows(seeded):
    gen, seed = seeded
    for blocks in (torch.randn(5, 7, generator=gen).to(torch.float16),  # one element a row: 2 bytes
                   torch.randint(0, 256, (4, 3, 13), generator=gen, dtype=torch.uint8),  # 13 bytes
                   torch.rand(4, 3, 9, generator=gen) > 0.5):  # bool: 9 bytes
        ids, valid = make_entries(gen, blocks.shape[0], blocks.shape[1], n=5)
        got = block_digest_ref.block_digest(blocks, ids, valid).tolist()
        assert got == python_digest(blocks, ids, valid), (blocks.dtype, seed)


def test_known_values_pin_the_definition():
    # one zero chunk at position 0 adds splitmix64's first output from seed 0
    assert digest_of_rows([bytes(8)]) == 0xE220A8397B1DCDAF
    assert digest_of_rows([]) == 0
    one = torch.zeros(1, 1, 2, dtype=torch.float32)
    assert block_digest_ref.block_digest(one, torch.tensor([0]), torch.tensor([1], dtype=torch.int32)).tolist() == [
        0xE220A8397B1DCDAF]
    # 6 bytes pad to the same chunk as 8 zero bytes; 0 rows digest to 0
    six = torch.zeros(1, 2, 3, dtype=torch.float16)
    ids = torch.tensor([0, 0])
    assert block_digest_ref.block_digest(six, ids, torch.tensor([1, 0], dtype=torch.int32)).tolist() == [
        0xE220A8397B1DCDAF, 0]


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_cpp_matches_reference_bit_for_bit(built, seeded, layout, block_size, dtype):
    gen, seed = seeded
    blocks = make_blocks(gen, layout, DTYPES[dtype], block_size, heads=4, dim=16)
    ids, valid = make_entries(gen, blocks.shape[0], block_size, n=12)
    got = cpp_digest(built, blocks, ids, valid)
    assert got.dtype == torch.uint64 and got.shape == (12,)
    assert got.tolist() == block_digest_ref.block_digest(blocks, ids, valid).tolist(), seed


@pytest.mark.parametrize("layout,reads", [("contiguous", "words"), ("pool", "words"), ("k+v", "words"),
                                          ("head-major", "words"), ("odd rows", "bytes"), ("tiny rows", "bytes"),
                                          ("copied", "copy")])
def test_each_layout_takes_the_read_it_is_meant_to(seeded, layout, reads):
    # a layout that silently fell to the copy (or to bytes) would pass every equality test
    gen, _ = seeded
    blocks = make_blocks(gen, layout, torch.bfloat16, 16)
    rows = byte_rows(blocks)
    taken = "copy" if rows is None else "words" if word_rows(rows) is not None else "bytes"
    assert taken == reads
    if rows is not None:  # the byte view is the same memory, in the same logical order
        assert rows.data_ptr() == blocks.data_ptr()
        assert torch.equal(rows.flatten(2), blocks.reshape(*blocks.shape[:2], -1).view(torch.uint8))


def test_digest_is_of_logical_content_not_layout(built, seeded):
    gen, seed = seeded
    head_major = make_blocks(gen, "head-major", torch.bfloat16, 16)
    contiguous = head_major.contiguous()
    ids, valid = make_entries(gen, 6, 16)
    want = block_digest_ref.block_digest(contiguous, ids, valid).tolist()
    assert block_digest_ref.block_digest(head_major, ids, valid).tolist() == want, seed
    assert cpp_digest(built, head_major, ids, valid).tolist() == want, seed


@pytest.mark.parametrize("layout", ["contiguous", "k+v", "odd rows", "tiny rows"])
@pytest.mark.parametrize("implementation", ["C++", "reference"])
def test_a_byte_changed_in_a_valid_row_changes_the_digest_and_past_valid_does_not(built, seeded, layout,
                                                                                   implementation):
    gen, seed = seeded
    digest = block_digest_ref.block_digest if implementation == "reference" else (
        lambda *args: cpp_digest(built, *args))
    blocks = make_blocks(gen, layout, torch.bfloat16, 16)
    ids = torch.tensor([2, 2, 2])
    valid = torch.tensor([9, 0, 16], dtype=torch.int32)
    before = digest(blocks, ids, valid).tolist()
    for row, changes in ((0, [True, False, True]), (8, [True, False, True]), (9, [False, False, True]),
                         (15, [False, False, True])):
        byte = int(torch.randint(0, row_bytes(blocks), (1,), generator=gen))
        bit = int(torch.randint(0, 8, (1,), generator=gen))
        flip_bit(blocks, 2, row, byte, bit)
        after = digest(blocks, ids, valid).tolist()
        assert [a != b for a, b in zip(after, before)] == changes, (row, byte, bit, seed)
        flip_bit(blocks, 2, row, byte, bit)
        assert digest(blocks, ids, valid).tolist() == before, seed


@pytest.mark.parametrize("implementation", ["C++", "reference"])
def test_swapped_rows_a_shifted_block_and_a_zero_row_change_the_digest(built, seeded, implementation):
    gen, seed = seeded
    digest = block_digest_ref.block_digest if implementation == "reference" else (
        lambda *args: cpp_digest(built, *args))
    blocks = make_blocks(gen, "pool", torch.float16, 16)
    ids, full = torch.tensor([1]), torch.tensor([16], dtype=torch.int32)
    before = digest(blocks, ids, full).tolist()
    swapped = blocks.clone()
    swapped[1, 3], swapped[1, 11] = blocks[1, 11], blocks[1, 3]
    assert digest(swapped, ids, full).tolist() != before, seed
    # the same rows one place later (a transfer written at the wrong offset)
    shifted = blocks.clone()
    shifted[1, 1:] = blocks[1, :-1]
    shifted[1, 0] = blocks[1, -1]
    assert digest(shifted, ids, full).tolist() != before, seed
    # a trailing row of zeros still counts: valid 5 and valid 4 differ
    zeroed = blocks.clone()
    zeroed[1, 4] = 0
    pair = digest(zeroed, torch.tensor([1, 1]), torch.tensor([5, 4], dtype=torch.int32)).tolist()
    assert pair[0] != pair[1], seed
    # another block's bytes (a misplaced or stale block)
    assert digest(blocks, torch.tensor([0]), full).tolist() != before, seed


def test_cpp_reads_only_the_counted_rows(built, seeded):
    """Rows past every entry's valid count, poisoned with NaN, leave the digests as they were."""
    gen, seed = seeded
    blocks = make_blocks(gen, "k+v", torch.float32, 16)
    ids, valid = make_entries(gen, 6, 16, n=10)
    want = cpp_digest(built, blocks, ids, valid).tolist()
    for b in set(ids.tolist()):
        blocks[b, int(valid[ids == b].max()):] = float("nan")
    assert cpp_digest(built, blocks, ids, valid).tolist() == want, seed


BAD_ENTRIES = [
    ([6], [1], "block_ids[0] = 6 is out of range for 6 blocks"),
    ([0, -1], [1, 1], "block_ids[1] = -1 is out of range for 6 blocks"),
    ([0, 5], [16, 17], "valid_rows[1] = 17 is outside [0, 16] (rows per block) for block 5"),
    ([3], [-1], "valid_rows[0] = -1 is outside [0, 16]"),
]


@pytest.mark.parametrize("ids,valid,message", BAD_ENTRIES)
@pytest.mark.parametrize("implementation", ["dispatcher", "reference", "C++ module"])
def test_bad_entries_are_refused_by_name(built, ids, valid, message, implementation):
    blocks = make_blocks(torch.Generator().manual_seed(0), "pool", torch.bfloat16, 16)
    ids, valid = torch.tensor(ids), torch.tensor(valid, dtype=torch.int32)
    if implementation == "C++ module":  # its own checks, without the Python ones in front
        if built is None:
            pytest.skip("the C++ module did not build here")
        call = lambda: built.block_digest(byte_rows(blocks), ids, valid)  # noqa: E731
    else:
        fn = block_digest if implementation == "dispatcher" else block_digest_ref.block_digest
        call = lambda: fn(blocks, ids, valid)  # noqa: E731
    with pytest.raises(ValueError, match=re.escape(message)):
        call()


@pytest.mark.parametrize("call,message", [
    (lambda b: block_digest(b[0, 0], torch.tensor([0]), torch.tensor([1])), r"blocks must be \[num_blocks, rows"),
    (lambda b: block_digest(b, torch.tensor([0, 1]), torch.tensor([1])),
     "block_ids has 2 entries but valid_rows has 1"),
    (lambda b: block_digest(b, torch.tensor([0.0]), torch.tensor([1])), "block_ids must be a 1-D integer tensor"),
    (lambda b: block_digest(b, torch.tensor([[0]]), torch.tensor([[1]])), "block_ids must be a 1-D integer tensor"),
])
def test_malformed_arguments_are_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call(torch.zeros(4, 16, 8))


def test_empty_inputs(built):
    blocks = torch.zeros(4, 16, 8)
    none = (torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int32))
    assert block_digest(blocks, *none).tolist() == [] == block_digest_ref.block_digest(blocks, *none).tolist()
    empty_rows = torch.zeros(4, 16, 0)
    ids, valid = torch.tensor([1, 3]), torch.tensor([16, 2], dtype=torch.int32)
    assert block_digest(empty_rows, ids, valid).tolist() == [0, 0]
    assert block_digest_ref.block_digest(empty_rows, ids, valid).tolist() == [0, 0]


def test_reference_mode_and_no_module_fall_back_to_the_reference(monkeypatch):
    monkeypatch.setenv(cpu_extension.ENV_VAR, "reference")
    cpu_extension.extension.cache_clear()
    try:
        assert digest_backend("cpu") == "torch"
        blocks = torch.randn(3, 4, 5)
        ids, valid = torch.tensor([2, 0]), torch.tensor([4, 3], dtype=torch.int32)
        assert block_digest(blocks, ids, valid).tolist() == python_digest(blocks, ids, valid)
    finally:
        cpu_extension.extension.cache_clear()
    assert digest_backend("cuda") == "triton" and digest_backend("meta") == "torch"
