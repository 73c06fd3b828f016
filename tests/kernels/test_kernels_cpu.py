"""The C++ CPU kernels (kernels.cpu_extension): decode attention in place against the float64
oracle, RMSNorm and RoPE against their formulas.

Both of its paths are checked: the vector one this machine's build has (AVX-512 or AVX2; CI
has run on both kinds of CPU) and the plain loops every other machine runs. The plan, and so the I1 mask, is the
reference's; what is checked here is that the kernel reads exactly the slots it leaves open.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernels import cpu_extension, paged_attention_cpu, paged_attention_ref, select_kernels
from kernels.paged_attention_ref import plan_decode
from tests.kernels.test_kernels_ref import (
    NO_WRITER,
    _poison_blocked_slots,
    assert_close,
    build_case,
    corrupt_some_pages,
    dense_oracle,
    make_tag,
    oracle_violations,
    plant_foreign_and_underfilled,
    tag_keep,
)

PATHS = [pytest.param(True, id="vector"), pytest.param(False, id="plain")]
pytestmark = pytest.mark.usefixtures("built")  # tests/kernels/conftest.py


def attend(case, vectorized=True, plan=None):
    plan = plan or plan_decode(case.block_table, case.expected, case.seq_lens, case.token_writer, case.page_size)
    out = paged_attention_cpu.attend_planned(case.q, case.k_cache, case.v_cache, plan, scale=case.scale,
                                             vectorized=vectorized)
    return out, plan


def test_the_build_key_changes_with_the_sources_and_their_place(tmp_path, monkeypatch):
    key = cpu_extension.build_key()
    assert key == cpu_extension.build_key() and len(key) == 12
    copy = tmp_path / "csrc"
    copy.mkdir()
    for path in (*cpu_extension.SOURCES, cpu_extension.CSRC / "cpu_kernels.h"):
        (copy / path.name).write_bytes(path.read_bytes())
    monkeypatch.setattr(cpu_extension, "CSRC", copy)
    monkeypatch.setattr(cpu_extension, "SOURCES", tuple(copy / p.name for p in cpu_extension.SOURCES))
    moved = cpu_extension.build_key()
    assert moved != key  # another checkout: its own build
    (copy / "norm_rope_cpu.cpp").write_text((copy / "norm_rope_cpu.cpp").read_text() + "\n// changed\n")
    assert cpu_extension.build_key() != moved


def test_the_kernel_builds_on_this_machine(built):
    # CI installs g++ and ninja: a build failure there must fail, not fall back unseen
    assert built is not None, "the CPU attention kernel did not build; see the warning above"
    assert cpu_extension.describe().startswith("in place, C++")


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return {flag for line in text.splitlines() if line.startswith("flags") for flag in line.split(":", 1)[1].split()}


def test_the_build_takes_the_widest_vectors_the_cpu_has(built):
    # a build that quietly lost its vector path runs 5-8x slower and every other test still passes
    flags = cpu_flags()
    if not flags:
        pytest.skip("no /proc/cpuinfo to read the CPU's flags from")
    want = "AVX-512" if "avx512f" in flags else "AVX2" if {"avx2", "fma"} <= flags else ""
    assert built.vector_isa() == want, (built.vector_isa(), want)
    assert built.vectorized_for(128) == bool(want)
    assert cpu_extension.describe() == f"in place, C++ ({want or 'plain loops'})"


VECTOR_WIDTH = {"AVX-512": 16, "AVX2": 8, "": 0}  # floats per vector of each path vector_isa() names


def path_rows(rows) -> dict[str, int]:
    """A kernel call's answer, (plain rows, vector rows), by name."""
    plain, vector = rows
    return {"plain": plain, "vector": vector}


def decode_rows_run(built, monkeypatch, case, vectorized):
    """The rows attend_planned's one kernel call attended on each path, as that call returned them."""
    answers = []

    class Recording:  # the built module, keeping what paged_decode answered
        def __getattr__(self, name):
            return getattr(built, name)

        def paged_decode(self, *args):
            answers.append(built.paged_decode(*args))
            return answers[-1]

    with monkeypatch.context() as patched:
        patched.setattr(cpu_extension, "extension", Recording)
        attend(case, vectorized)
    assert len(answers) == 1, answers
    return path_rows(answers[0])


@pytest.mark.parametrize("head_dim", [16, 36, 40, 64, 128])
def test_each_head_dim_runs_the_path_the_build_promises(built, monkeypatch, head_dim):
    """vector_isa() names the macro the build took; each call's answer says what actually ran.
    A build whose dispatch lost its vector branch passes every accuracy test at plain-loop speed."""
    width = VECTOR_WIDTH[built.vector_isa()]
    vector = bool(width) and head_dim % width == 0  # 40: AVX2's 5 vectors, AVX-512's plain loops
    assert built.vectorized_for(head_dim) == vector
    lens = [5, 17, 0, 9]
    case = build_case(torch.Generator().manual_seed(head_dim), lens, kv_heads=2, group=3, head_dim=head_dim)
    decode_rows = 3 * 2  # rows with something to read, times kv heads
    want = {"vector": decode_rows, "plain": 0} if vector else {"vector": 0, "plain": decode_rows}
    assert decode_rows_run(built, monkeypatch, case, True) == want
    assert decode_rows_run(built, monkeypatch, case, False) == {"vector": 0, "plain": decode_rows}
    q, k, v = fused_qkv(torch.Generator().manual_seed(1), sum(lens), 6, 2, head_dim)
    starts = torch.tensor([0, 5, 22, 22, 31], dtype=torch.int64)
    prefill_rows = sum(lens) * 2
    out = torch.empty(q.shape)
    want = {"vector": prefill_rows, "plain": 0} if vector else {"vector": 0, "plain": prefill_rows}
    assert path_rows(built.causal_prefill(q, k, v, starts, head_dim ** -0.5, out, True)) == want
    assert_close(out, causal_oracle(q, k, v, lens), 1e-5)
    out_plain = torch.empty(q.shape)
    assert path_rows(built.causal_prefill(q, k, v, starts, head_dim ** -0.5, out_plain, False)) == {
        "vector": 0, "plain": prefill_rows}


@pytest.mark.parametrize("vectorized", PATHS)
@pytest.mark.parametrize("kv_heads,group,head_dim", [(1, 8, 128), (3, 3, 64), (2, 7, 40), (1, 1, 64), (2, 7, 16)])
def test_scores_far_apart_keep_the_max_and_exps_range(vectorized, kv_heads, group, head_dim):
    """q x 50: scores spread over hundreds, so most of each softmax's exp arguments fall far
    below float's range (a clamp set lower than -87.3 builds garbage exponent bits; clamp and
    underflow mask both gone, the same) and a max taken over too few of the scores overflows
    to inf. Lengths leave every tail width of 8 and 16. (Either guard alone is redundant: the
    mask zeroes what the clamp lets through, and the clamp's 2^-126 is 0 to within 1e-38.)"""
    lens = [1, 3, 37, 70, 9, 16, 23]
    case = build_case(torch.Generator().manual_seed(group * head_dim), lens, kv_heads=kv_heads, group=group,
                      head_dim=head_dim, page_size=16)
    case.q *= 50
    for b, n in list(enumerate(lens))[::2]:  # these rows' largest score on their last token, in the tail
        page, slot = int(case.block_table[b, (n - 1) // 16]), (n - 1) % 16
        case.k_cache[page, slot] = case.q[b].view(kv_heads, group, head_dim).mean(1) / 10
    out, _ = attend(case, vectorized)
    want = dense_oracle(case, tag_keep(case))
    b, n = 3, lens[3]  # a row of random scores (spread ~50 per unit of q . k)
    pages = case.block_table[b, : -(-n // 16)].long()
    keys = case.k_cache[pages].reshape(-1, kv_heads, head_dim)[:n].repeat_interleave(group, dim=1)
    spread = torch.einsum("hd,thd->ht", case.q[b], keys) * case.scale
    assert (spread.max(1).values - spread.min(1).values).min() > 100  # far past exp's range: the clamp must hold
    assert out.isfinite().all()
    assert_close(out, want, 1e-4)


@pytest.mark.parametrize("vectorized", PATHS)
@pytest.mark.parametrize("kv_heads,group,head_dim,page_size", [
    (1, 8, 128, 16),  # the copy model's shape
    (3, 3, 64, 16),   # the 135M shape: 9 heads over 3
    (2, 1, 64, 32),
    (1, 2, 128, 32),
    (2, 4, 16, 4),    # one vector per row
    (1, 5, 32, 16),   # an odd group: pairs, then one head alone
    (2, 7, 64, 16),   # 7 = 4 + 2 + 1 heads per V load, 3 pairs + 1 per K load
    (2, 2, 40, 16),   # head_dim a multiple of 8, not of 16: AVX2's vectors, AVX-512's plain loops
    (1, 4, 36, 16),   # a multiple of neither: the plain loops either way
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


@pytest.mark.parametrize("vectorized", PATHS)
def test_nan_in_the_query_or_a_readable_key_turns_the_row_to_nan_as_in_the_reference(vectorized):
    """A NaN the row may read is the row's own problem and must show (the reference and SDPA
    give NaN); it must not be quietly dropped as if that slot were blocked."""
    case = build_case(torch.Generator().manual_seed(13), [9, 7, 5], head_dim=32, group=4)
    case.q[0, 1, 3] = float("nan")
    case.k_cache[int(case.block_table[1, 1]), 0] = float("nan")  # token 4 of row 1: readable
    case.k_cache[int(case.block_table[2, 0]), 1, 0, 0] = float("inf")
    out, _ = attend(case, vectorized)
    want = dense_oracle(case, tag_keep(case))
    for b in range(3):
        assert out[b].isnan().tolist() == want[b].isnan().tolist(), b
    assert out[0].isnan().any() and out[1].isnan().any() and out[2].isnan().any()


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
    no_heads = torch.zeros(4, 4, 0, 16)
    with pytest.raises(RuntimeError, match="query heads 4 are not a multiple of kv heads 0"):
        built.paged_decode(case.q, no_heads, no_heads, plan.pages, blocked, 1.0, out, True)


def test_what_the_kernel_cannot_take_goes_to_the_reference():
    """A float64 out, V laid out unlike K, or a V that wants a gradient (which the kernel
    would silently drop): not the kernel's."""
    case = build_case(torch.Generator().manual_seed(14), [5, 12], head_dim=32)
    plan = plan_decode(case.block_table, case.expected, case.seq_lens, case.token_writer, case.page_size)
    want = dense_oracle(case, tag_keep(case))
    out64 = torch.empty(case.q.shape, dtype=torch.float64)
    assert not paged_attention_cpu.usable(case.q, case.k_cache, case.v_cache, out64)
    v_apart = case.v_cache.contiguous()
    assert not paged_attention_cpu.usable(case.q, case.k_cache, v_apart)
    v_grad = case.v_cache.clone().requires_grad_()
    assert not paged_attention_cpu.usable(case.q, case.k_cache, v_grad)
    for v, out in ((case.v_cache, out64), (v_apart, None)):
        got = paged_attention_cpu.attend_planned(case.q, case.k_cache, v, plan, scale=case.scale, out=out)
        assert_close(got, want, 1e-5)


def test_the_torch_backend_attends_in_place_unless_told_not_to(monkeypatch):
    monkeypatch.delenv("PAGEWARDEN_KERNELS", raising=False)
    kernels = select_kernels("auto", "cpu")
    assert kernels.attend_planned is paged_attention_cpu.attend_planned
    assert kernels.plan_decode is paged_attention_cpu.plan_decode
    assert kernels.attention.startswith("in place, C++")
    monkeypatch.setenv(cpu_extension.ENV_VAR, "reference")
    cpu_extension.extension.cache_clear()
    kernels = select_kernels("auto", "cpu")
    assert kernels.attention == "torch reference (gather + SDPA)"
    case = build_case(torch.Generator().manual_seed(7), [9, 4], head_dim=16)
    assert not paged_attention_cpu.usable(case.q, case.k_cache)
    monkeypatch.setenv(cpu_extension.ENV_VAR, "fast")
    with pytest.raises(ValueError, match="PAGEWARDEN_CPU_KERNELS='fast' is not one of auto, reference"):
        cpu_extension.mode()


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
        corrupt_some_pages(case, lens, gen, poison=True)
    out, plan = attend(case, vectorized)
    assert_close(out, dense_oracle(case, tag_keep(case)), 1e-5)
    assert torch.equal(plan.violations, oracle_violations(case))


# ---- the step's I1 plan (csrc/decode_plan_cpu.cpp) against the reference's --------------

def assert_same_plan(got, want):
    assert torch.equal(got.pages, want.pages)
    assert torch.equal(got.blocked, want.blocked)
    assert torch.equal(got.violations, want.violations) and got.violations.dtype == torch.int32
    for name in ("empty_rows", "foreign"):
        a, b = getattr(got, name), getattr(want, name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert torch.equal(a, b), name


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lens=st.lists(st.integers(0, 40), min_size=1, max_size=5), page_size=st.sampled_from([1, 4, 16]),
    seed=st.integers(0, 2**31), corrupt=st.integers(0, 3), check_tags=st.booleans(), mask_foreign=st.booleans(),
)
def test_plan_matches_the_reference(lens, page_size, seed, corrupt, check_tags, mask_foreign):
    """Random tables with foreign slots, unwritten tails, foreign whole pages and garbage in
    the padding columns: the same pages, mask, counts, foreign slots and empty rows."""
    gen = torch.Generator().manual_seed(seed)
    case = build_case(gen, lens, page_size=page_size)
    used = [(b, j) for b, n in enumerate(lens) for j in range(-(-n // page_size))]
    for b, j in used[:: max(1, 4 - corrupt)] if corrupt else []:
        page = int(case.block_table[b, j])
        slot = int(torch.randint(0, page_size, (1,), generator=gen))
        kind = int(torch.randint(0, 3, (1,), generator=gen))
        if kind == 0:
            case.token_writer[page, slot] = make_tag(500, b)
        elif kind == 1:
            case.token_writer[page, slot:] = NO_WRITER
        else:
            case.token_writer[page] = make_tag(600, j)
    args = (case.block_table, case.expected, case.seq_lens, case.token_writer, page_size, check_tags, mask_foreign)
    assert_same_plan(paged_attention_cpu.plan_decode(*args), paged_attention_ref.plan_decode(*args))


def test_plan_errors_name_the_row_and_the_limit():
    case = build_case(torch.Generator().manual_seed(2), [5, 3])
    with pytest.raises(ValueError, match="seq_len 40 needs 10 pages but block_table has"):
        paged_attention_cpu.plan_decode(case.block_table, case.expected, torch.tensor([40, 1], dtype=torch.int32),
                                        case.token_writer, case.page_size)
    outside = case.block_table.clone()
    outside[1, 0] = case.token_writer.shape[0]
    with pytest.raises(RuntimeError, match=f"row 1 names page {case.token_writer.shape[0]} outside the pool"):
        paged_attention_cpu.plan_decode(outside, case.expected, case.seq_lens, case.token_writer, case.page_size)


def test_plan_checks_each_page_against_its_own_columns_epoch():
    """A page re-granted in a newer epoch that still holds the older epoch's tokens: same
    slot, same request, wrong epoch for that column. Foreign, and masked."""
    case = build_case(torch.Generator().manual_seed(0), [8], page_size=4)
    case.expected[0, 0], case.expected[0, 1] = make_tag(1, 10), make_tag(1, 11)
    case.token_writer[int(case.block_table[0, 0])] = make_tag(1, 10)
    case.token_writer[int(case.block_table[0, 1])] = make_tag(1, 10)  # stale
    args = (case.block_table, case.expected, case.seq_lens, case.token_writer, 4)
    plan = paged_attention_cpu.plan_decode(*args)
    assert plan.violations.tolist() == [[4, 0]]
    assert plan.blocked.view(-1)[:8].tolist() == [False] * 4 + [True] * 4
    assert_same_plan(plan, paged_attention_ref.plan_decode(*args))


def test_plan_takes_what_the_reference_takes_and_names_a_page_size_mismatch():
    case = build_case(torch.Generator().manual_seed(1), [9, 3], page_size=4)
    want = paged_attention_ref.plan_decode(case.block_table, case.expected, case.seq_lens, case.token_writer, 4)
    wide = torch.zeros(case.token_writer.shape[0], 8, dtype=torch.int64)
    wide[:, ::2] = case.token_writer  # a non-contiguous view of the same tags
    got = paged_attention_cpu.plan_decode(case.block_table.long(), case.expected.to(torch.int64), case.seq_lens,
                                          wide[:, ::2], 4)
    assert_same_plan(got, want)
    with pytest.raises(ValueError, match=r"token_writer must be \[num_pages, page_size=8\], got \(\d+, 4\)"):
        paged_attention_cpu.plan_decode(case.block_table, case.expected, case.seq_lens, case.token_writer, 8)


def test_plan_no_writer_is_the_engines():
    """decode_plan_cpu.cpp writes NO_WRITER as -1: an unwritten slot must count as unwritten."""
    case = build_case(torch.Generator().manual_seed(3), [4])
    case.token_writer[int(case.block_table[0, 0]), 2:] = NO_WRITER
    plan = paged_attention_cpu.plan_decode(case.block_table, case.expected, case.seq_lens, case.token_writer,
                                           case.page_size)
    assert plan.violations.tolist() == [[0, 2]]


# ---- RMSNorm and RoPE (csrc/norm_rope_cpu.cpp) -------------------------------------------

@pytest.mark.parametrize("shape", [(16, 128), (1, 576), (3, 5, 40), (0, 64)])
def test_rms_norm_matches_the_formula(built, shape):
    gen = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, generator=gen) * 3
    w = torch.randn(shape[-1], generator=gen)
    expected = (x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5)) * w.double()
    got = built.rms_norm(x, w, 1e-5)
    assert got.shape == x.shape and got.dtype == torch.float32
    if x.numel():
        assert_close(got, expected, 1e-6)


def test_rms_norm_adds_eps_inside_the_root(built):
    x = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.5, -0.5, 0.5, -0.5]])
    got = built.rms_norm(x, torch.ones(4), 0.75)
    assert got[0].eq(0).all()  # a zero row stays zero, not NaN
    assert torch.allclose(got[1], x[1] / (0.25 + 0.75) ** 0.5)


def test_rms_norm_names_a_weight_that_does_not_fit(built):
    with pytest.raises(RuntimeError, match=r"weight must be \[128\], got \[64\]"):
        built.rms_norm(torch.ones(2, 128), torch.ones(64), 1e-5)
    with pytest.raises(RuntimeError, match="x must be Float, got Half"):
        built.rms_norm(torch.ones(2, 128, dtype=torch.half), torch.ones(128), 1e-5)


@pytest.mark.parametrize("heads,head_dim", [(9, 128), (12, 64), (2, 6)])
def test_rope_in_place_equals_the_torch_formula_bit_for_bit(built, heads, head_dim):
    """Rotates a strided view (q and k inside the fused qkv output) in place, leaves v alone,
    and gives exactly torch's x * cos + rotate_half(x) * sin (no FMA contraction)."""
    from engine.model.layers import RotaryTable, _rotate_half

    gen = torch.Generator().manual_seed(heads)
    table = RotaryTable(head_dim, 10000.0, 64)
    cos, sin = table.lookup(torch.tensor([0, 5, 17, 63, 2]), torch.float32)
    qkv = torch.randn(5, (heads + 2) * head_dim, generator=gen)
    view = qkv[:, : (heads + 1) * head_dim].view(5, heads + 1, head_dim)
    expected = view * cos[:, None] + _rotate_half(view) * sin[:, None]
    v_before = qkv[:, (heads + 1) * head_dim:].clone()
    built.rope_(view, cos, sin)
    assert torch.equal(view, expected)
    assert torch.equal(qkv[:, (heads + 1) * head_dim:], v_before)
    with pytest.raises(RuntimeError, match=r"cos and sin must be \[5, "):
        built.rope_(view, cos[:4], sin[:4])


def test_the_model_uses_them_only_where_no_gradient_is_wanted(monkeypatch):
    """Under inference the layers call the C++ norm and RoPE; with autograd on a parameter,
    or with the kernels turned off, the torch formulas (which record a graph)."""
    from engine.model.layers import RMSNorm, apply_rope

    norm = RMSNorm(64, 1e-5)
    x = torch.randn(4, 64)
    calls = []
    ext = cpu_extension.extension()

    class Spy:
        def __getattr__(self, name):
            calls.append(name)
            return getattr(ext, name)

    monkeypatch.setattr(cpu_extension, "extension", lambda: Spy())
    with torch.inference_mode():
        norm(x)
        apply_rope(torch.randn(4, 2, 8), torch.ones(4, 8), torch.zeros(4, 8), may_overwrite=True)
        apply_rope(torch.randn(4, 2, 8), torch.ones(4, 8), torch.zeros(4, 8))  # not told it may overwrite
    assert calls == ["rms_norm", "rope_"]
    out = norm(x)  # grad enabled, weight is a parameter
    assert out.grad_fn is not None and calls == ["rms_norm", "rope_"]


# ---- prefill: causal attention over a pass's own K/V (csrc/attention_cpu.cpp) -------------

def causal_oracle(q, k, v, lens):
    """float64, sequence by sequence, query heads grouped over KV heads."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    group, start = q.shape[1] // k.shape[1], 0
    for n in lens:
        qs, ks, vs = (t[start:start + n].double() for t in (q, k, v))
        ks, vs = ks.repeat_interleave(group, dim=1), vs.repeat_interleave(group, dim=1)
        scores = torch.einsum("thd,shd->hts", qs, ks) * q.shape[-1] ** -0.5
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        out[start:start + n] = torch.einsum("hts,shd->thd", torch.softmax(scores, dim=-1), vs)
        start += n
    return out


def fused_qkv(gen, tokens, heads, kv_heads, head_dim):
    """q, k, v as the model makes them: views into one [T, (H + 2 KVH) D] projection output."""
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen)
    q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
    k = qkv[:, heads * head_dim: (heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
    v = qkv[:, (heads + kv_heads) * head_dim:].view(tokens, kv_heads, head_dim)
    return q, k, v


@pytest.mark.parametrize("vectorized", PATHS)
@pytest.mark.parametrize("kv_heads,group,head_dim", [(1, 8, 128), (3, 3, 64), (2, 1, 16), (1, 5, 40), (1, 7, 64)])
def test_causal_prefill_matches_the_oracle(built, vectorized, kv_heads, group, head_dim):
    lens = [1, 17, 0, 64, 3]
    q, k, v = fused_qkv(torch.Generator().manual_seed(head_dim), sum(lens), kv_heads * group, kv_heads, head_dim)
    starts = torch.tensor([0, 1, 18, 18, 82, 85], dtype=torch.int64)
    out = torch.full(q.shape, float("nan"))
    built.causal_prefill(q, k, v, starts, head_dim ** -0.5, out, vectorized)
    assert_close(out, causal_oracle(q, k, v, lens), 1e-5)


def test_the_model_prefills_through_the_kernel_and_the_reference_alike(monkeypatch):
    """DenseCausalAttention takes the kernel under inference, SDPA otherwise; same answer."""
    from engine.attention import DenseCausalAttention

    lens = [5, 33, 1]
    q, k, v = fused_qkv(torch.Generator().manual_seed(2), sum(lens), 6, 2, 32)
    calls = []
    ext = cpu_extension.extension()
    monkeypatch.setattr(cpu_extension, "extension", lambda: calls.append(1) or ext)
    with torch.inference_mode():
        fast = DenseCausalAttention(lens).attend(0, q, k, v)
    assert calls
    calls.clear()
    monkeypatch.setattr(DenseCausalAttention, "CPU_KERNEL_MAX_TOKENS", 32)  # 33 tokens: SDPA
    with torch.inference_mode():
        slow = DenseCausalAttention(lens).attend(0, q, k, v)
    assert not calls
    assert_close(fast, causal_oracle(q, k, v, lens), 1e-5)
    assert_close(slow, causal_oracle(q, k, v, lens), 1e-5)


def test_prefill_stays_on_sdpa_where_the_build_has_no_vectors_for_the_head_dim(monkeypatch):
    """The plain loops are 5-7x slower than SDPA at prefill (bench/RESULTS.md): a build or a
    head_dim without the vector path must not take them."""
    from engine.attention import DenseCausalAttention

    ext = cpu_extension.extension()
    prefills = []

    class Build:
        def __init__(self, vectors):
            self.vectors = vectors

        def vectorized_for(self, head_dim):
            return self.vectors

        def causal_prefill(self, *args):
            prefills.append(args)
            return ext.causal_prefill(*args)

    lens = [9, 4]
    q, k, v = fused_qkv(torch.Generator().manual_seed(5), sum(lens), 4, 2, 32)
    for vectors, takes_kernel in ((True, True), (False, False)):
        prefills.clear()
        monkeypatch.setattr(cpu_extension, "extension", lambda b=Build(vectors): b)
        with torch.inference_mode():
            got = DenseCausalAttention(lens).attend(0, q, k, v)
        assert bool(prefills) == takes_kernel
        assert_close(got, causal_oracle(q, k, v, lens), 1e-5)


def test_causal_prefill_names_bounds_that_do_not_fit(built):
    q, k, v = fused_qkv(torch.Generator().manual_seed(3), 10, 4, 2, 16)
    out = torch.empty(q.shape)
    with pytest.raises(RuntimeError, match="starts must run from 0 to 10"):
        built.causal_prefill(q, k, v, torch.tensor([0, 4, 9]), 1.0, out, True)
    with pytest.raises(RuntimeError, match="starts must not decrease"):
        built.causal_prefill(q, k, v, torch.tensor([0, 6, 4, 10]), 1.0, out, True)
