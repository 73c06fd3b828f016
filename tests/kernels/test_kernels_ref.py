"""Torch reference kernels against a naive dense float64 oracle, plus backend selection.

The helpers here (build_case, dense_oracle, ...) are shared with test_kernels_triton.py.
"""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import REPO_ROOT
from kernels import KernelSet, paged_attention_ref, select_kernels
from kernels.kv_store_ref import store_kv
from kernels.paged_attention_ref import attend_planned, paged_decode_attention, plan_decode
from kernels.scrub_ref import scrub_pages

# padding entries of a block table: must never be dereferenced
_PADDING = (-1, 0, 10**6)
NO_WRITER = -1


def make_tag(slot: int, epoch: int) -> int:
    return (slot << 32) | (epoch & 0xFFFFFFFF)


def build_case(gen, lens, *, kv_heads=2, group=2, head_dim=8, page_size=4, num_layers=3,
               layer=1, spare_pages=4, dtype=torch.float32):
    """A pool with every sequence's pages scattered at random, each needed token slot tagged
    by its sequence (slots past a sequence's end: nobody). Each page column has an epoch of
    its own, as the engine's grants do: a check against the wrong column's tag fails."""
    pages_per_seq = [-(-n // page_size) for n in lens]
    width = max(pages_per_seq, default=0) + 1  # always at least one padding column
    num_pages = sum(pages_per_seq) + spare_pages
    data = torch.randn(num_pages, num_layers, 2, page_size, kv_heads, head_dim, generator=gen).to(dtype)
    order = torch.randperm(num_pages, generator=gen).tolist()
    block_table = torch.empty(len(lens), width, dtype=torch.int32)
    expected = torch.empty(len(lens), width, dtype=torch.int64)
    # spare pages hold some other request's tokens
    token_writer = torch.full((num_pages, page_size), make_tag(999, 7), dtype=torch.int64)
    for b, n in enumerate(lens):
        for j in range(width):
            tag = make_tag(b + 1, int(torch.randint(0, 2**32, (1,), generator=gen)))
            expected[b, j] = tag
            if j < pages_per_seq[b]:
                page = order.pop()
                block_table[b, j] = page
                written = min(page_size, n - j * page_size)
                token_writer[page, :written] = tag
                token_writer[page, written:] = NO_WRITER
            else:
                block_table[b, j] = _PADDING[(b + j) % len(_PADDING)]
    q = torch.randn(len(lens), kv_heads * group, head_dim, generator=gen).to(dtype)
    return SimpleNamespace(
        data=data, k_cache=data[:, layer, 0], v_cache=data[:, layer, 1], q=q,
        block_table=block_table, expected=expected, token_writer=token_writer,
        seq_lens=torch.tensor(lens, dtype=torch.int32), page_size=page_size, group=group,
        scale=head_dim**-0.5,
    )


def run_kernel(fn, case, **kwargs):
    return fn(case.q, case.k_cache, case.v_cache, case.block_table, case.expected, case.seq_lens,
              case.token_writer, scale=case.scale, **kwargs)


def tag_keep(case):
    """The I1 rule spelled out slot by slot: a token is read only if its tag is the reader's."""
    def keep(b, j, slot):
        page = int(case.block_table[b, j])
        return int(case.token_writer[page, slot]) == int(case.expected[b, j])
    return keep


def dense_oracle(case, keep=None):
    """Naive float64 attention: gather token by token, repeat kv heads, softmax."""
    batch, num_heads, head_dim = case.q.shape
    out = torch.zeros(batch, num_heads, head_dim, dtype=torch.float64)
    for b, n in enumerate(case.seq_lens.tolist()):
        keys, values = [], []
        for t in range(n):
            j, slot = divmod(t, case.page_size)
            page = int(case.block_table[b, j])
            if keep is None or keep(b, j, slot):
                keys.append(case.k_cache[page, slot])
                values.append(case.v_cache[page, slot])
        if not keys:
            continue
        k = torch.stack(keys).double().repeat_interleave(case.group, dim=1)
        v = torch.stack(values).double().repeat_interleave(case.group, dim=1)
        scores = torch.einsum("hd,thd->ht", case.q[b].double(), k) * case.scale
        out[b] = torch.einsum("ht,thd->hd", torch.softmax(scores, dim=-1), v)
    return out


def oracle_violations(case):
    """[B, 2]: (foreign, unwritten) token slots each sequence needs, counted one by one."""
    counts = []
    for b, n in enumerate(case.seq_lens.tolist()):
        foreign = unwritten = 0
        for t in range(n):
            j, slot = divmod(t, case.page_size)
            tag = int(case.token_writer[int(case.block_table[b, j]), slot])
            if tag != int(case.expected[b, j]):
                unwritten += tag == NO_WRITER
                foreign += tag != NO_WRITER
        counts.append([foreign, unwritten])
    return torch.tensor(counts, dtype=torch.int32).reshape(-1, 2)


def plant_foreign_and_underfilled(case, foreign=(0, 1), underfilled=(2, 0), filled_to=1):
    """Give one page another request's tag and leave another written only up to `filled_to`."""
    case.token_writer[int(case.block_table[foreign])] = make_tag(77, 3)
    case.token_writer[int(case.block_table[underfilled]), filled_to:] = NO_WRITER


def corrupt_some_pages(case, lens, gen, *, poison=False):
    """Every third page a row uses: one slot gets another request's tag, or the page is
    unwritten from one slot on. poison: NaN in that slot's K too (it must stay unread)."""
    page_size = case.page_size
    used = [(b, j) for b, n in enumerate(lens) for j in range(-(-n // page_size))]
    for b, j in used[::3]:
        page = int(case.block_table[b, j])
        slot = int(torch.randint(0, page_size, (1,), generator=gen))
        if int(torch.randint(0, 2, (1,), generator=gen)):
            case.token_writer[page, slot] = make_tag(500, b)
        else:
            case.token_writer[page, slot:] = NO_WRITER
        if poison:
            case.k_cache[page, slot] = float("nan")


def assert_close(actual, expected, rtol, msg=""):
    scale = expected.abs().max().clamp_min(1e-30)
    err = ((actual.double() - expected.double()).abs().max() / scale).item()
    assert err < rtol, f"relative error {err:.3g} >= {rtol} {msg}"


RAGGED = [1, 8, 0, 13, 4, 16]  # incl. 1, exact page multiples (page_size 4) and 0


@pytest.mark.parametrize("kv_heads,group", [(2, 1), (2, 2), (1, 4), (4, 1)])
def test_reference_matches_dense_oracle(kv_heads, group):
    case = build_case(torch.Generator().manual_seed(kv_heads * 10 + group), RAGGED,
                      kv_heads=kv_heads, group=group)
    assert not case.k_cache.is_contiguous()
    out, violations = run_kernel(paged_decode_attention, case)
    assert_close(out, dense_oracle(case), 1e-5)
    assert violations.tolist() == [[0, 0]] * len(RAGGED)
    assert out[2].eq(0).all()


def test_reference_masks_foreign_and_unwritten_slots():
    case = build_case(torch.Generator().manual_seed(1), [9, 12, 7])
    plant_foreign_and_underfilled(case)
    out, violations = run_kernel(paged_decode_attention, case)
    # sequence 0 needs all 4 slots of its page 1 (another's); sequence 2 needs 4 of its
    # page 0 and finds 3 of them unwritten; only those slots are masked
    assert violations.tolist() == [[4, 0], [0, 0], [0, 3]]
    assert torch.equal(violations, oracle_violations(case))
    foreign_page = int(case.block_table[0, 1])
    without_foreign = dense_oracle(case, keep=lambda b, j, s: int(case.block_table[b, j]) != foreign_page
                                   or b != 0)
    assert_close(out[0], without_foreign[0], 1e-5)
    assert_close(out, dense_oracle(case, tag_keep(case)), 1e-5)


def test_reference_reads_own_slots_of_a_page_another_request_also_wrote():
    # the slots a reader wrote stay readable; only the one another request wrote is masked
    case = build_case(torch.Generator().manual_seed(11), [8])
    page = int(case.block_table[0, 1])
    case.token_writer[page, 2] = make_tag(42, 1)
    out, violations = run_kernel(paged_decode_attention, case)
    assert violations.tolist() == [[1, 0]]
    keep = lambda b, j, s: not (j == 1 and s == 2)  # noqa: E731
    assert_close(out, dense_oracle(case, keep), 1e-5)


def test_reference_unchecked_reads_everything():
    case = build_case(torch.Generator().manual_seed(2), [9, 12, 7])
    # unchecked means the tags do not matter: every slot here names another writer
    case.token_writer = torch.full_like(case.token_writer, make_tag(1234, 5))
    out, violations = run_kernel(paged_decode_attention, case, check_tags=False)
    assert violations.tolist() == [[0, 0]] * 3
    assert_close(out, dense_oracle(case), 1e-5)


def test_reference_fully_masked_row_is_zero_and_poison_does_not_leak():
    case = build_case(torch.Generator().manual_seed(3), [6, 5])
    foreign = case.block_table[0, :2].long()
    case.token_writer[foreign] = make_tag(5, 5)
    case.k_cache[foreign] = float("nan")
    case.v_cache[foreign] = float("nan")
    last = int(case.block_table[1, 1])
    case.v_cache[last, 1:] = float("nan")  # beyond seq_len 5 in a page holding one token
    out, violations = run_kernel(paged_decode_attention, case)
    assert out[0].eq(0).all() and violations.tolist() == [[6, 0], [0, 0]]
    assert_close(out, dense_oracle(case, tag_keep(case)), 1e-5)
    out, _ = run_kernel(paged_decode_attention, case, check_tags=False)
    assert out[1].isfinite().all()


def _poison_blocked_slots(case, *layer_caches):
    """NaN into every slot a reader may not use, in K and V (the poison scrub writes both):
    padding past each sequence's end and a foreign page. A blocked slot that reached SDPA
    unzeroed would turn its row to NaN."""
    case.token_writer[int(case.block_table[0, 0])] = make_tag(5, 5)
    for cache in layer_caches:
        cache[int(case.block_table[0, 0])] = float("nan")
        for b, n in enumerate(case.seq_lens.tolist()):
            j, slot = divmod(n, case.page_size)
            if n and slot:
                cache[int(case.block_table[b, j]), slot:] = float("nan")


def test_one_plan_serves_every_layer_and_zeroes_each_layers_blocked_slots():
    """The gathered K/V buffers are reused layer after layer: each layer's blocked slots
    must be masked again, and no layer may see the previous layer's K/V."""
    case = build_case(torch.Generator().manual_seed(8), [6, 9, 3], num_layers=3)
    for layer in range(3):
        _poison_blocked_slots(case, case.data[:, layer, 0], case.data[:, layer, 1])
    plan = plan_decode(case.block_table, case.expected, case.seq_lens, case.token_writer, case.page_size)
    for layer in (2, 0, 1):
        case.k_cache, case.v_cache = case.data[:, layer, 0], case.data[:, layer, 1]
        out = attend_planned(case.q, case.k_cache, case.v_cache, plan, scale=case.scale)
        assert out.isfinite().all(), f"layer {layer}"
        assert_close(out, dense_oracle(case, tag_keep(case)), 1e-5, f"layer {layer}")


@pytest.mark.parametrize("budget_rows", [1, 2])
def test_gather_in_chunks_matches_one_gather(monkeypatch, budget_rows):
    """Past the gather budget the batch is attended a few rows at a time; each chunk masks
    its own rows' blocked slots."""
    case = build_case(torch.Generator().manual_seed(9), [6, 9, 3, 13, 1])
    _poison_blocked_slots(case, case.k_cache, case.v_cache)
    width = -(-int(case.seq_lens.max()) // case.page_size)
    per_seq = width * case.k_cache[0].numel() * 2 * 4
    monkeypatch.setattr(paged_attention_ref, "_GATHER_BUDGET_BYTES", per_seq * budget_rows)
    out, violations = run_kernel(paged_decode_attention, case)
    assert out.isfinite().all()
    assert_close(out, dense_oracle(case, tag_keep(case)), 1e-5)
    assert torch.equal(violations, oracle_violations(case))


def test_reference_writes_preallocated_buffers():
    case = build_case(torch.Generator().manual_seed(4), [3, 0, 10])
    out = torch.full_like(case.q, float("nan"))
    violations = torch.full((3, 2), 123, dtype=torch.int32)
    got_out, got_violations = run_kernel(paged_decode_attention, case, out=out, violations=violations)
    assert got_out is out and got_violations is violations
    assert_close(out, dense_oracle(case), 1e-5)
    assert violations.tolist() == [[0, 0]] * 3


def test_reference_bfloat16_within_tolerance():
    case = build_case(torch.Generator().manual_seed(5), [7, 16, 2], dtype=torch.bfloat16)
    out, _ = run_kernel(paged_decode_attention, case)
    assert out.dtype == torch.bfloat16
    assert_close(out, dense_oracle(case), 2e-2)


def test_reference_rejects_bad_shapes():
    case = build_case(torch.Generator().manual_seed(6), [5, 3])
    with pytest.raises(ValueError, match="seq_len 40 needs 10 pages"):
        paged_decode_attention(case.q, case.k_cache, case.v_cache, case.block_table, case.expected,
                               torch.tensor([40, 1], dtype=torch.int32), case.token_writer, scale=1.0)
    with pytest.raises(ValueError, match="expected_tags"):
        paged_decode_attention(case.q, case.k_cache, case.v_cache, case.block_table,
                               case.expected[:, :1], case.seq_lens, case.token_writer, scale=1.0)
    with pytest.raises(ValueError, match="token_writer"):
        paged_decode_attention(case.q, case.k_cache, case.v_cache, case.block_table, case.expected,
                               case.seq_lens, case.token_writer[:, :1], scale=1.0)


@settings(max_examples=40, deadline=None)
@given(
    lens=st.lists(st.integers(0, 14), min_size=1, max_size=4),
    kv_heads=st.integers(1, 3), group=st.sampled_from([1, 2, 4]), head_dim=st.sampled_from([4, 8]),
    page_size=st.sampled_from([1, 3, 4]), seed=st.integers(0, 2**31), corrupt=st.booleans(),
)
def test_reference_property_matches_oracle(lens, kv_heads, group, head_dim, page_size, seed, corrupt):
    gen = torch.Generator().manual_seed(seed)
    case = build_case(gen, lens, kv_heads=kv_heads, group=group, head_dim=head_dim, page_size=page_size)
    if corrupt:
        corrupt_some_pages(case, lens, gen)
    out, violations = run_kernel(paged_decode_attention, case)
    assert_close(out, dense_oracle(case, tag_keep(case)), 1e-5)
    assert torch.equal(violations, oracle_violations(case))


def test_store_kv_reference_writes_only_addressed_slots():
    gen = torch.Generator().manual_seed(7)
    data = torch.randn(6, 2, 2, 4, 2, 8, generator=gen)
    before = data.clone()
    writer = torch.full((6,), -1, dtype=torch.int64)
    filled = torch.tensor([0, 0, 0, 3, 0, 0], dtype=torch.int32)
    token_writer = torch.full((6, 4), -1, dtype=torch.int64)
    k_new, v_new = torch.randn(4, 2, 8, generator=gen), torch.randn(4, 2, 8, generator=gen)
    slots = torch.tensor([9, -1, 10, 12])  # page 2 offsets 1, 2; page 3 offset 0
    tags = torch.tensor([make_tag(1, 1), make_tag(9, 9), make_tag(1, 1), make_tag(2, 5)])
    store_kv(data[:, 1, 0], data[:, 1, 1], k_new, v_new, slots, tags, writer, filled, token_writer)
    expected = before.clone()
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            expected[slot // 4, 1, 0, slot % 4] = k_new[t]
            expected[slot // 4, 1, 1, slot % 4] = v_new[t]
    assert torch.equal(data, expected)
    assert writer.tolist() == [-1, -1, make_tag(1, 1), make_tag(2, 5), -1, -1]
    want_tokens = torch.full((6, 4), -1, dtype=torch.int64)
    want_tokens[2, 1] = want_tokens[2, 2] = make_tag(1, 1)
    want_tokens[3, 0] = make_tag(2, 5)
    assert torch.equal(token_writer, want_tokens)  # each written slot names its writer, nothing else
    # filled counts slots written: page 2 got offsets 1 and 2; page 3 had 3 and got one more
    assert filled.tolist() == [0, 0, 2, 4, 0, 0]
    writer2, filled2, tokens2 = writer.clone(), filled.clone(), token_writer.clone()
    store_kv(data[:, 1, 0], data[:, 1, 1], k_new, v_new, slots, tags, writer2, filled2, tokens2, stamp=False)
    assert torch.equal(writer2, writer) and torch.equal(filled2, filled)  # later layers do not stamp
    assert torch.equal(tokens2, token_writer)


@pytest.mark.parametrize("value", [0.0, float("nan")])
def test_scrub_reference_fills_only_listed_pages(value):
    data = torch.randn(5, 3, 2, 4, dtype=torch.float32) + 10
    before = data.clone()
    scrub_pages(data, torch.tensor([3, 1]), value)
    for page in range(5):
        if page in (1, 3):
            assert (data[page].isnan().all() if value != value else data[page].eq(0).all())
        else:
            assert torch.equal(data[page], before[page])


def test_select_kernels_torch_and_errors(monkeypatch):
    monkeypatch.delenv("PAGEWARDEN_KERNELS", raising=False)
    kernels = select_kernels("auto", "cpu")
    assert isinstance(kernels, KernelSet) and kernels.name == "torch"
    assert kernels.paged_decode_attention is paged_decode_attention
    with pytest.raises(ValueError, match="'cuda-fast'.*auto, triton, torch"):
        select_kernels("cuda-fast", "cpu")
    monkeypatch.setenv("PAGEWARDEN_KERNELS", "torch")
    assert select_kernels("triton", "cpu").name == "torch"
    monkeypatch.setenv("PAGEWARDEN_KERNELS", "bogus")
    with pytest.raises(ValueError, match="bogus"):
        select_kernels("auto", "cpu")


def test_importing_kernels_does_not_import_triton():
    code = "import sys, kernels, kernels.backend; sys.exit('triton' in sys.modules)"
    repo = REPO_ROOT
    assert subprocess.run([sys.executable, "-c", code], cwd=repo, timeout=120).returncode == 0


def test_the_kernels_no_writer_tag_is_the_engines():
    # kernels/ may not import engine/, so the value is written in both; they must agree
    from engine.wire.page_tags import NO_WRITER as ENGINE_NO_WRITER
    from kernels.paged_attention_ref import NO_WRITER as KERNEL_NO_WRITER

    assert KERNEL_NO_WRITER == ENGINE_NO_WRITER == NO_WRITER
