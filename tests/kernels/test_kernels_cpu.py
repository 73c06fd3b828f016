"""The in-place C++ decode attention (kernels.paged_attention_cpu) against the float64 oracle.

Both of its paths are checked: the AVX-512 one (on a machine that has it, as this one and CI
do) and the plain loops every other machine runs. The plan, and so the I1 mask, is the
reference's; what is checked here is that the kernel reads exactly the slots it leaves open.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernels import paged_attention_cpu, select_kernels
from kernels.paged_attention_ref import plan_decode
from tests.kernels.test_kernels_ref import (
    NO_WRITER,
    _poison_blocked_slots,
    assert_close,
    build_case,
    dense_oracle,
    make_tag,
    oracle_violations,
    plant_foreign_and_underfilled,
    tag_keep,
)

PATHS = [pytest.param(True, id="avx512"), pytest.param(False, id="plain")]


@pytest.fixture(autouse=True)
def built(monkeypatch):
    """The kernel as the engine gets it: PAGEWARDEN_CPU_ATTENTION unset, built (or cached)."""
    monkeypatch.delenv(paged_attention_cpu.ENV_VAR, raising=False)
    paged_attention_cpu.extension.cache_clear()
    yield paged_attention_cpu.extension()
    paged_attention_cpu.extension.cache_clear()


def attend(case, vectorized=True, plan=None):
    plan = plan or plan_decode(case.block_table, case.expected, case.seq_lens, case.token_writer, case.page_size)
    out = paged_attention_cpu.attend_planned(case.q, case.k_cache, case.v_cache, plan, scale=case.scale,
                                             vectorized=vectorized)
    return out, plan


def test_the_kernel_builds_on_this_machine(built):
    # CI installs g++ and ninja: a build failure there must fail, not fall back unseen
    assert built is not None, "the CPU attention kernel did not build; see the warning above"
    assert paged_attention_cpu.describe().startswith("in place, C++")


@pytest.mark.parametrize("vectorized", PATHS)
@pytest.mark.parametrize("kv_heads,group,head_dim,page_size", [
    (1, 8, 128, 16),  # the copy model's shape
    (3, 3, 64, 16),   # the 135M shape: 9 heads over 3
    (2, 1, 64, 32),
    (1, 2, 128, 32),
    (2, 4, 16, 4),    # one vector per row
    (1, 5, 32, 16),   # an odd group: pairs, then one head alone
    (2, 2, 40, 16),   # head_dim not a multiple of 16: the plain loops either way
])
def test_matches_oracle_with_foreign_and_unwritten_slots(vectorized, kv_heads, group, head_dim, page_size):
    lens = [1, page_size, 0, 3 * page_size + 5, 40, 2 * page_size + 1]
    case = build_case(torch.Generator().manual_seed(head_dim + group), lens, kv_heads=kv_heads, group=group,
                      head_dim=head_dim, page_size=page_size)
    plant_foreign_and_underfilled(case, foreign=(3, 1), underfilled=(4, 0), filled_to=2)
    case.token_writer[int(case.block_table[5, 0]), 3] = make_tag(88, 1)  # one foreign slot mid-page
    out, plan = attend(case, vectorized)
    assert_close(out, dense_oracle(case, tag_keep(case)), 1e-5)
    assert torch.equal(plan.violations, oracle_violations(case))
    assert out[2].eq(0).all()  # seq_len 0: nothing to attend


@pytest.mark.parametrize("vectorized", PATHS)
def test_poison_in_blocked_slots_never_reaches_any_layer(vectorized):
    """NaN in every blocked slot of K and V, in every layer: the kernel must not read them
    (the reference zeroes its copy; this one must skip them, or 0 * NaN leaks)."""
    case = build_case(torch.Generator().manual_seed(8), [6, 9, 3, 33], num_layers=3, head_dim=32, group=4)
    for layer in range(3):
        _poison_blocked_slots(case, case.data[:, layer, 0], case.data[:, layer, 1])
    plan = None
    for layer in (2, 0, 1):
        case.k_cache, case.v_cache = case.data[:, layer, 0], case.data[:, layer, 1]
        out, plan = attend(case, vectorized, plan)
        assert out.isfinite().all(), f"layer {layer}"
        assert_close(out, dense_oracle(case, tag_keep(case)), 1e-5, f"layer {layer}")


@pytest.mark.parametrize("vectorized", PATHS)
def test_a_row_with_nothing_readable_is_zero(vectorized):
    case = build_case(torch.Generator().manual_seed(3), [6, 5], head_dim=16)
    foreign = case.block_table[0, :2].long()
    case.token_writer[foreign] = make_tag(5, 5)
    case.k_cache[foreign] = float("nan")
    case.v_cache[foreign] = float("nan")
    out, plan = attend(case, vectorized)
    assert out[0].eq(0).all() and plan.violations.tolist() == [[6, 0], [0, 0]]
    assert_close(out, dense_oracle(case, tag_keep(case)), 1e-5)


def test_the_detector_without_the_defence_reads_foreign_slots():
    """mask_foreign=False (counting, not masking): the kernel reads what the plan leaves open,
    foreign slots included, exactly as the reference does."""
    case = build_case(torch.Generator().manual_seed(4), [9, 7], head_dim=32)
    plant_foreign_and_underfilled(case, foreign=(0, 1), underfilled=(1, 1), filled_to=3)
    plan = plan_decode(case.block_table, case.expected, case.seq_lens, case.token_writer, case.page_size,
                       mask_foreign=False)
    out, _ = attend(case, True, plan)
    assert_close(out, dense_oracle(case), 1e-5)
    assert plan.violations.tolist() == oracle_violations(case).tolist()


def test_long_contexts_and_a_batch_wider_than_the_threads():
    case = build_case(torch.Generator().manual_seed(11), [700, 1, 257, 512, 33] * 3, kv_heads=1, group=8,
                      head_dim=128, page_size=16)
    out, _ = attend(case)
    assert_close(out, dense_oracle(case, tag_keep(case)), 1e-5)


def test_writes_the_callers_buffer_even_when_it_is_strided():
    case = build_case(torch.Generator().manual_seed(12), [5, 12], head_dim=32)
    plan = plan_decode(case.block_table, case.expected, case.seq_lens, case.token_writer, case.page_size)
    contiguous = torch.full_like(case.q, float("nan"))
    strided = torch.full((case.q.shape[0], case.q.shape[1], 2 * case.q.shape[2]), float("nan"))[..., ::2]
    for out in (contiguous, strided):
        got = paged_attention_cpu.attend_planned(case.q, case.k_cache, case.v_cache, plan, scale=case.scale, out=out)
        assert got is out
        assert_close(out, dense_oracle(case, tag_keep(case)), 1e-5)


def test_other_dtypes_go_through_the_reference():
    case = build_case(torch.Generator().manual_seed(5), [7, 16, 2], dtype=torch.bfloat16)
    assert not paged_attention_cpu.usable(case.q, case.k_cache)
    out, _ = attend(case)
    assert out.dtype == torch.bfloat16
    assert_close(out, dense_oracle(case), 2e-2)


def test_bad_input_is_named_not_read(built):
    case = build_case(torch.Generator().manual_seed(6), [5, 3], head_dim=16)
    plan = plan_decode(case.block_table, case.expected, case.seq_lens, case.token_writer, case.page_size)
    out = torch.empty_like(case.q)
    blocked = plan.blocked.view(2, -1)
    outside = plan.pages.clone()
    outside[0, 0] = case.k_cache.shape[0] + 3
    with pytest.raises(RuntimeError, match=f"page {case.k_cache.shape[0] + 3} is outside the pool"):
        built.paged_decode(case.q, case.k_cache, case.v_cache, outside, blocked, 1.0, out, True)
    with pytest.raises(RuntimeError, match="q must be Float, got Double"):
        built.paged_decode(case.q.double(), case.k_cache, case.v_cache, plan.pages, blocked, 1.0, out, True)
    with pytest.raises(RuntimeError, match=r"blocked must be contiguous \[2, "):
        built.paged_decode(case.q, case.k_cache, case.v_cache, plan.pages, blocked[:, :3], 1.0, out, True)


def test_the_torch_backend_attends_in_place_unless_told_not_to(monkeypatch):
    monkeypatch.delenv("PAGEWARDEN_KERNELS", raising=False)
    kernels = select_kernels("auto", "cpu")
    assert kernels.attend_planned is paged_attention_cpu.attend_planned
    assert kernels.attention.startswith("in place, C++")
    monkeypatch.setenv(paged_attention_cpu.ENV_VAR, "reference")
    paged_attention_cpu.extension.cache_clear()
    kernels = select_kernels("auto", "cpu")
    assert kernels.attention == "torch reference (gather + SDPA)"
    case = build_case(torch.Generator().manual_seed(7), [9, 4], head_dim=16)
    assert not paged_attention_cpu.usable(case.q, case.k_cache)
    monkeypatch.setenv(paged_attention_cpu.ENV_VAR, "fast")
    with pytest.raises(ValueError, match="PAGEWARDEN_CPU_ATTENTION='fast' is not one of auto, reference"):
        paged_attention_cpu.mode()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lens=st.lists(st.integers(0, 70), min_size=1, max_size=5),
    kv_heads=st.integers(1, 3), group=st.integers(1, 8), head_dim=st.sampled_from([16, 32, 48, 24]),
    page_size=st.sampled_from([1, 4, 16]), seed=st.integers(0, 2**31), corrupt=st.booleans(),
    vectorized=st.booleans(),
)
def test_property_matches_oracle(lens, kv_heads, group, head_dim, page_size, seed, corrupt, vectorized):
    gen = torch.Generator().manual_seed(seed)
    case = build_case(gen, lens, kv_heads=kv_heads, group=group, head_dim=head_dim, page_size=page_size)
    if corrupt:
        used = [(b, j) for b, n in enumerate(lens) for j in range(-(-n // page_size))]
        for b, j in used[::3]:
            page = int(case.block_table[b, j])
            slot = int(torch.randint(0, page_size, (1,), generator=gen))
            if int(torch.randint(0, 2, (1,), generator=gen)):
                case.token_writer[page, slot] = make_tag(500, b)
            else:
                case.token_writer[page, slot:] = NO_WRITER
            case.k_cache[page, slot] = float("nan")
    out, plan = attend(case, vectorized)
    assert_close(out, dense_oracle(case, tag_keep(case)), 1e-5)
    assert torch.equal(plan.violations, oracle_violations(case))
