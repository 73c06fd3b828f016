"""I1 for pages shared through the prefix cache, in every decode kernel (torch reference, C++
plan, Triton under the interpreter): a row reads a shared page only when the page's writer tag
is the one its table expects (the page's original writer) and the page's prefix key equals the
key the row computed from its own tokens and salt.
"""

from __future__ import annotations

import os
import secrets

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of the Triton kernel modules

from kernels import paged_attention_cpu, paged_attention_ref  # noqa: E402
from tests.kernels.test_kernels_ref import (  # noqa: E402
    NO_WRITER,
    assert_close,
    build_case,
    dense_oracle,
    make_tag,
    run_kernel,
)

KEY_A, KEY_B = 0x1234_5678_9ABC, 0x0FED_CBA9_8765  # two tenants' keys for the same tokens


def shared_case(seed: int, *, reader_key: int):
    """Three rows; rows 1 and 2 read row 0's first page as a shared page (its tag is row 0's,
    its key KEY_A). Row 1 computed KEY_A for it (same prefix, same salt); row 2 computed
    `reader_key`. Every other page is keyed 0 on both sides (private)."""
    gen = torch.Generator().manual_seed(seed)
    case = build_case(gen, [9, 11, 6], page_size=4, spare_pages=6)
    shared = int(case.block_table[0, 0])
    tag = int(case.expected[0, 0])
    for row in (1, 2):
        case.block_table[row, 0] = shared
        case.expected[row, 0] = tag
    page_keys = torch.zeros(case.k_cache.shape[0], dtype=torch.int64)
    page_keys[shared] = KEY_A
    expected_keys = torch.zeros_like(case.expected)
    expected_keys[0, 0] = KEY_A
    expected_keys[1, 0] = KEY_A
    expected_keys[2, 0] = reader_key
    case.page_keys, case.expected_keys = page_keys, expected_keys
    return case


def keep_with_keys(case):
    def keep(b, j, slot):
        page = int(case.block_table[b, j])
        return (int(case.token_writer[page, slot]) == int(case.expected[b, j])
                and int(case.page_keys[page]) == int(case.expected_keys[b, j]))
    return keep


def plan_of(module, case, **kwargs):
    return module.plan_decode(case.block_table, case.expected, case.seq_lens, case.token_writer, case.page_size,
                              page_keys=case.page_keys, expected_keys=case.expected_keys, **kwargs)


@pytest.mark.parametrize("module", [paged_attention_ref, paged_attention_cpu], ids=["reference", "cpu"])
def test_same_key_reads_the_shared_page_and_another_key_is_foreign(module):
    seed = secrets.randbits(31)
    good = plan_of(module, shared_case(seed, reader_key=KEY_A))
    assert good.violations.tolist() == [[0, 0]] * 3, f"seed {seed}"
    bad = plan_of(module, shared_case(seed, reader_key=KEY_B))
    # row 2 needed all 4 slots of the shared page: every one is foreign, and masked
    assert bad.violations.tolist() == [[0, 0], [0, 0], [4, 0]], f"seed {seed}"
    assert bool(bad.blocked[2, :4].all()) and not bool(bad.blocked[1, :4].any())
    # the same plan without keys cannot tell: the tag alone matches (what the key adds)
    blind = module.plan_decode(*(getattr(shared_case(seed, reader_key=KEY_B), n) for n in (
        "block_table", "expected", "seq_lens", "token_writer", "page_size")))
    assert blind.violations.tolist() == [[0, 0]] * 3


@pytest.mark.parametrize("module", [paged_attention_ref, paged_attention_cpu], ids=["reference", "cpu"])
def test_a_private_page_that_became_keyed_is_foreign_to_a_reader_that_expects_no_key(module):
    case = shared_case(secrets.randbits(31), reader_key=KEY_A)
    case.expected_keys[1, 0] = 0  # row 1's table says the page is private to it: a stale or wrong table
    plan = plan_of(module, case)
    assert plan.violations[1].tolist() == [4, 0]


def test_an_unwritten_slot_of_a_mismatched_page_counts_as_unwritten_in_both():
    case = shared_case(secrets.randbits(31), reader_key=KEY_B)
    case.token_writer[int(case.block_table[2, 0]), 3] = NO_WRITER
    for module in (paged_attention_ref, paged_attention_cpu):
        assert plan_of(module, case).violations[2].tolist() == [3, 1]


@pytest.mark.parametrize("reader_key", [KEY_A, KEY_B], ids=["same-salt", "other-salt"])
def test_reference_attention_with_keys_matches_the_dense_oracle(reader_key):
    case = shared_case(secrets.randbits(31), reader_key=reader_key)
    out, violations = run_kernel(paged_attention_ref.paged_decode_attention, case, page_keys=case.page_keys,
                                 expected_keys=case.expected_keys)
    assert_close(out, dense_oracle(case, keep_with_keys(case)), 1e-5)
    assert int(violations[2, 0]) == (0 if reader_key == KEY_A else 4)


@pytest.mark.parametrize("reader_key", [KEY_A, KEY_B], ids=["same-salt", "other-salt"])
def test_triton_with_keys_matches_the_reference(reader_key):
    pytest.importorskip("triton")
    from kernels.paged_attention_triton import paged_decode_attention

    seed = secrets.randbits(31)
    case = shared_case(seed, reader_key=reader_key)
    keys = {"page_keys": case.page_keys, "expected_keys": case.expected_keys}
    got, got_v = run_kernel(paged_decode_attention, case, partition_size=16, **keys)
    want, want_v = run_kernel(paged_attention_ref.paged_decode_attention, case, **keys)
    assert_close(got, want, 1e-4, f"(seed {seed})")
    assert got_v.tolist() == want_v.tolist(), f"seed {seed}"


def test_keys_go_together_and_have_their_shapes():
    case = shared_case(1, reader_key=KEY_A)
    with pytest.raises(ValueError, match="go together"):
        run_kernel(paged_attention_ref.paged_decode_attention, case, page_keys=case.page_keys)
    with pytest.raises(ValueError, match="page_keys must be"):
        run_kernel(paged_attention_ref.paged_decode_attention, case, page_keys=case.page_keys[:-1],
                   expected_keys=case.expected_keys)


def test_cpu_plan_with_keys_matches_the_reference_on_random_keys():
    seed = secrets.randbits(31)
    gen = torch.Generator().manual_seed(seed)
    case = shared_case(seed, reader_key=KEY_A)
    # random keys on every page, each row expecting the right one on a random half of its columns
    case.page_keys = torch.randint(1, 4, (case.k_cache.shape[0],), generator=gen, dtype=torch.int64)
    right = case.page_keys[case.block_table.clamp(0, case.k_cache.shape[0] - 1).long()]
    coin = torch.randint(0, 2, right.shape, generator=gen).bool()
    case.expected_keys = torch.where(coin, right, right + 7)
    for check_tags, mask in ((True, True), (True, False), (False, True)):
        want = plan_of(paged_attention_ref, case, check_tags=check_tags, mask_foreign=mask)
        got = plan_of(paged_attention_cpu, case, check_tags=check_tags, mask_foreign=mask)
        assert torch.equal(got.violations, want.violations), f"seed {seed}"
        assert torch.equal(got.blocked, want.blocked), f"seed {seed}"


def test_a_tag_of_another_writer_on_a_key_matched_page_is_still_foreign():
    """A request writing into a page it shares (shared_page_written) leaves its own tag there:
    the key matches, the tag does not, and the other holders' reads of that slot are foreign."""
    case = shared_case(secrets.randbits(31), reader_key=KEY_A)
    case.token_writer[int(case.block_table[1, 0]), 2] = make_tag(2, 5)
    for module in (paged_attention_ref, paged_attention_cpu):
        assert plan_of(module, case).violations[:, 0].tolist() == [1, 1, 1]
