"""Triton kernels against the torch references, under the interpreter when there is no GPU.

Inputs are fresh random every run; a failure message carries the seed to replay it.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

import torch

from engine.config import REPO_ROOT

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of the kernel modules

import pytest  # noqa: E402

pytest.importorskip("triton")

from kernels import paged_attention_ref, select_kernels  # noqa: E402
from kernels.kv_store_triton import store_kv  # noqa: E402
from kernels.paged_attention_triton import paged_decode_attention  # noqa: E402
from kernels.scrub_triton import scrub_pages  # noqa: E402
from tests.kernels.test_kernels_ref import (  # noqa: E402
    assert_close,
    build_case,
    dense_oracle,
    make_tag,
    oracle_violations,
    plant_foreign_and_underfilled,
    run_kernel,
    tag_keep,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
REPO = REPO_ROOT


@pytest.fixture
def seeded():
    """A generator with a fresh seed; the seed is in every assertion message."""
    seed = secrets.randbits(31)
    return torch.Generator().manual_seed(seed), f"(seed {seed})"


def on_device(case):
    for name, value in vars(case).items():
        if isinstance(value, torch.Tensor):
            setattr(case, name, value.to(DEVICE))
    case.k_cache, case.v_cache = case.data[:, 1, 0], case.data[:, 1, 1]
    return case


def on_cpu(case):
    cpu = type(case)(**{k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in vars(case).items()})
    cpu.k_cache, cpu.v_cache = cpu.data[:, 1, 0], cpu.data[:, 1, 1]
    return cpu


def triton_and_reference(case, **kwargs):
    """Run both backends; the Triton output buffer starts as NaN so every element must be written."""
    out = torch.full_like(case.q, float("nan"))
    violations = torch.full((case.q.shape[0], 2), -7, dtype=torch.int32, device=case.q.device)
    got = run_kernel(paged_decode_attention, case, out=out, violations=violations, **kwargs)
    kwargs.pop("partition_size", None)
    want = run_kernel(paged_attention_ref.paged_decode_attention, case, **kwargs)
    return got, want


@pytest.mark.parametrize("kv_heads,group,partition_size", [(2, 2, 16), (1, 4, 128), (3, 1, 32)])
def test_triton_matches_reference(seeded, kv_heads, group, partition_size):
    gen, seed = seeded
    lens = [1, 16, 0, 45, 13, 160][: 6 if partition_size == 128 else 5]
    case = on_device(build_case(gen, lens, kv_heads=kv_heads, group=group, head_dim=16))
    (out, violations), (ref_out, ref_violations) = triton_and_reference(case, partition_size=partition_size)
    assert not out.isnan().any(), seed
    assert_close(out.cpu(), ref_out.cpu(), 1e-5, seed)
    assert_close(out.cpu(), dense_oracle(on_cpu(case)), 1e-5, seed)
    assert violations.tolist() == ref_violations.tolist() == [[0, 0]] * len(lens), seed
    assert out[lens.index(0)].eq(0).all(), seed


def test_triton_merges_more_partitions_than_one_chunk(seeded):
    """The merge walks the partitions MERGE_CHUNK at a time (it held them all at once and
    spilled registers at long contexts): 1 to 3 chunks and a ragged last one agree with the
    reference and the dense oracle."""
    from kernels.paged_attention_triton import MERGE_CHUNK

    gen, seed = seeded
    lens = [16 * MERGE_CHUNK, 16 * MERGE_CHUNK + 1, 16 * (2 * MERGE_CHUNK + 5) + 7, 3, 0]
    case = on_device(build_case(gen, lens, kv_heads=1, group=2, head_dim=16))
    (out, violations), (ref_out, _) = triton_and_reference(case, partition_size=16)
    assert not out.isnan().any(), seed
    assert_close(out.cpu(), ref_out.cpu(), 1e-5, seed)
    assert_close(out.cpu(), dense_oracle(on_cpu(case)), 1e-5, seed)
    assert out[lens.index(0)].eq(0).all(), seed


def test_triton_masks_foreign_and_unwritten_slots(seeded):
    gen, seed = seeded
    case = on_device(build_case(gen, [9, 12, 7, 40], head_dim=16))
    plant_foreign_and_underfilled(case)
    foreign_page = int(case.block_table[0, 1])
    case.v_cache[foreign_page] = float("nan")  # poison must not leak through a masked page
    (out, violations), (ref_out, ref_violations) = triton_and_reference(case, partition_size=16)
    cpu = on_cpu(case)
    assert (violations.tolist() == ref_violations.tolist() == oracle_violations(cpu).tolist()
            == [[4, 0], [0, 0], [0, 3], [0, 0]]), seed
    without_foreign = dense_oracle(cpu, keep=lambda b, j, s: b != 0 or int(cpu.block_table[b, j]) != foreign_page)
    assert_close(out[0].cpu(), without_foreign[0], 1e-5, seed)
    assert_close(out.cpu(), dense_oracle(cpu, tag_keep(cpu)), 1e-5, seed)
    assert_close(out.cpu(), ref_out.cpu(), 1e-5, seed)


def test_triton_random_shapes_and_corruption_match_reference(seeded):
    gen, seed = seeded

    def pick(options):
        return options[int(torch.randint(0, len(options), (1,), generator=gen))]

    for trial in range(4):
        lens = torch.randint(0, 50, (int(torch.randint(1, 5, (1,), generator=gen)),), generator=gen).tolist()
        page_size = pick([1, 4, 5, 16])
        case = on_device(build_case(gen, lens, kv_heads=pick([1, 2]), group=pick([1, 2, 4, 8]),
                                    head_dim=pick([16, 24]), page_size=page_size))
        for b, n in enumerate(lens):
            for j in range(-(-n // page_size)):
                page = int(case.block_table[b, j])
                roll = int(torch.randint(0, 6, (1,), generator=gen))
                slot = int(torch.randint(0, page_size, (1,), generator=gen))
                if roll == 0:
                    case.token_writer[page, slot] = make_tag(600 + b, j)
                elif roll == 1:
                    case.token_writer[page, slot:] = -1
        what = f"{seed} trial {trial}: lens {lens} page_size {page_size}"
        (out, violations), (ref_out, ref_violations) = triton_and_reference(case, partition_size=pick([16, 32]))
        assert violations.tolist() == ref_violations.tolist(), what
        assert_close(out.cpu(), ref_out.cpu(), 1e-5, what)


def test_triton_never_reads_a_page_outside_the_pool(seeded):
    gen, seed = seeded
    case = on_device(build_case(gen, [12, 6], head_dim=16))
    case.block_table[0, 1] = 10**6  # a corrupt entry inside the sequence
    out = torch.full_like(case.q, float("nan"))
    out, violations = run_kernel(paged_decode_attention, case, out=out, partition_size=16)
    assert violations.tolist() == [[4, 0], [0, 0]], seed  # its 4 slots name nobody's data
    cpu = on_cpu(case)
    keep = lambda b, j, s: b != 0 or j != 1  # noqa: E731
    assert_close(out.cpu(), dense_oracle(cpu, keep), 1e-5, seed)


def test_triton_unchecked_attends_everything(seeded):
    gen, seed = seeded
    case = on_device(build_case(gen, [9, 12, 33], head_dim=16))
    plant_foreign_and_underfilled(case)
    (out, violations), (ref_out, _) = triton_and_reference(case, check_tags=False, partition_size=16)
    assert violations.tolist() == [[0, 0]] * 3, seed
    assert_close(out.cpu(), dense_oracle(on_cpu(case)), 1e-5, seed)
    assert_close(out.cpu(), ref_out.cpu(), 1e-5, seed)


def test_triton_fully_masked_row_is_zero(seeded):
    gen, seed = seeded
    case = on_device(build_case(gen, [20, 3], head_dim=16))
    case.token_writer[case.block_table[0, :5].long()] = make_tag(42, 1)
    (out, violations), _ = triton_and_reference(case, partition_size=16)
    assert out[0].eq(0).all() and not out.isnan().any(), seed
    assert violations.tolist() == [[20, 0], [0, 0]], seed


def test_triton_float16_within_tolerance(seeded):
    # bfloat16 tl.dot is unsupported by the interpreter (triton-lang/triton#11584); fp16 takes the same path
    gen, seed = seeded
    case = on_device(build_case(gen, [7, 30], head_dim=16, dtype=torch.float16))
    (out, _), _ = triton_and_reference(case, partition_size=16)
    assert out.dtype == torch.float16
    assert_close(out.cpu(), dense_oracle(on_cpu(case)), 5e-3, seed)


def test_triton_store_kv_writes_only_addressed_slots(seeded):
    gen, seed = seeded
    data = torch.randn(7, 3, 2, 4, 2, 16, generator=gen).to(DEVICE)
    before = data.clone()
    writer = torch.full((7,), -1, dtype=torch.int64, device=DEVICE)
    filled = torch.tensor([0, 0, 0, 3, 0, 0, 0], dtype=torch.int32, device=DEVICE)
    token_writer = torch.full((7, 4), -1, dtype=torch.int64, device=DEVICE)
    k_new = torch.randn(5, 2, 16, generator=gen).to(DEVICE)
    v_new = torch.randn(5, 2, 16, generator=gen).to(DEVICE)
    slots = torch.tensor([9, -1, 10, 12, 27], device=DEVICE)
    tags = torch.tensor([make_tag(1, 1), make_tag(9, 9), make_tag(1, 1), make_tag(2, 5), make_tag(3, 3)],
                        device=DEVICE)
    store_kv(data[:, 2, 0], data[:, 2, 1], k_new, v_new, slots, tags, writer, filled, token_writer)
    expected = before.clone()
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            expected[slot // 4, 2, 0, slot % 4] = k_new[t]
            expected[slot // 4, 2, 1, slot % 4] = v_new[t]
    assert torch.equal(data, expected), seed
    assert writer.tolist() == [-1, -1, make_tag(1, 1), make_tag(2, 5), -1, -1, make_tag(3, 3)], seed
    assert filled.tolist() == [0, 0, 2, 4, 0, 0, 1], seed  # slots written, gaps show
    want_tokens = torch.full((7, 4), -1, dtype=torch.int64)
    for slot, tag in zip(slots.tolist(), tags.tolist()):
        if slot >= 0:
            want_tokens.view(-1)[slot] = tag
    assert torch.equal(token_writer.cpu(), want_tokens), seed  # I1's tag on exactly the slots written
    store_kv(data[:, 2, 0], data[:, 2, 1], k_new, v_new, slots, tags, writer, filled, token_writer, stamp=False)
    assert filled.tolist() == [0, 0, 2, 4, 0, 0, 1], seed


@pytest.mark.parametrize("value", [0.0, float("nan")])
def test_triton_scrub_fills_only_listed_pages(seeded, value):
    gen, seed = seeded
    data = (torch.randn(6, 2, 2, 4, 2, 8, generator=gen) + 10).to(DEVICE)
    before = data.clone()
    scrub_pages(data, torch.tensor([4, 1], device=DEVICE), value)
    for page in range(6):
        if page in (1, 4):
            assert (data[page].isnan().all() if value != value else data[page].eq(0).all()), seed
        else:
            assert torch.equal(data[page], before[page]), seed


def test_select_kernels_refuses_kernels_compiled_without_interpreter():
    code = (
        "import kernels.paged_attention_triton, kernels.kv_store_triton, kernels.scrub_triton\n"
        "from kernels import select_kernels\n"
        "try:\n    select_kernels('triton', 'cpu')\nexcept RuntimeError as e:\n    print(e)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PAGEWARDEN_KERNELS")}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert "without TRITON_INTERPRET=1" in proc.stdout, proc.stdout + proc.stderr


def test_select_kernels_triton(monkeypatch):
    monkeypatch.delenv("PAGEWARDEN_KERNELS", raising=False)
    kernels = select_kernels("triton", DEVICE)
    assert kernels.name == "triton" and kernels.paged_decode_attention is paged_decode_attention
    monkeypatch.setenv("PAGEWARDEN_KERNELS", "triton")
    assert select_kernels("torch", "cpu").store_kv is store_kv
