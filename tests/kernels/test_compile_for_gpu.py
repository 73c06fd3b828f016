"""Every Triton kernel compiles for sm_80 and sm_90 at the engine's shapes, within the devices' limits.

No GPU needed: Triton compiles for a named target with the ptxas its wheel ships. What is
compiled is what the launchers themselves ask for (tests/kernels/compile_for_target.py), so
constexprs, block sizes, num_warps and the alignment specialization are the engine's own.
Shapes that ask for the same binary (equal Triton cache key) compile once: the store and the
scrub do not see the GQA group or the tag check, the merge not the group. `-s` prints the
shared memory and registers of every distinct binary.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("triton")
pytest.importorskip("triton.knobs", reason="compiling for a named target here needs Triton >= 3.4 (triton.knobs)")

from tests.kernels.compile_for_target import (  # noqa: E402
    TARGETS,
    MissingTool,
    Shape,
    compile_grid_in_subprocess,
    jit_kernel_names,
)

# the grid of issue 17: every dtype x head dim x GQA group x page size x tag check ...
GRID = [
    Shape(dtype, head_dim, group, page_size, check_tags)
    for dtype in ("bf16", "fp16") for head_dim in (64, 128) for group in range(1, 9)
    for page_size in (16, 32) for check_tags in (True, False)
]
# ... and block tables that specialize differently: one partition and a width that is not a
# multiple of 16 (100 tokens), and the merge's partition tile growing with the context
CONTEXTS = [Shape("bf16", 128, 4, 16, True, context) for context in (100, 32768, 131072)]
SHAPES = GRID + CONTEXTS
# (launch, kernel): paged_decode_attention runs two kernels; store_kv runs stamped in the
# first layer of a step and unstamped in the others
LAUNCHED = [
    ("decode", "_decode_partition_kernel"),
    ("decode", "_merge_partitions_kernel"),
    ("store stamp", "_store_kv_kernel"),
    ("store", "_store_kv_kernel"),
    ("scrub", "_scrub_pages_kernel"),
    ("digest", "_digest_words_kernel"),
    ("digest k+v", "_digest_words_kernel"),
    ("digest odd rows", "_digest_bytes_kernel"),
]


def shape_id(shape: Shape) -> str:
    tags = "tags" if shape.check_tags else "notags"
    return f"{shape.dtype}-d{shape.head_dim}-g{shape.group}-p{shape.page_size}-{tags}-ctx{shape.context}"


@pytest.fixture(scope="module")
def grid(request):
    """Compile, in a fresh process and once per distinct binary, what the selected tests need."""
    params = [item.callspec.params for item in request.session.items
              if getattr(item, "module", None) is request.module and hasattr(item, "callspec")]
    jobs = sorted({(p["arch"], p["shape"]) for p in params}, key=lambda job: (job[0], shape_id(job[1])))
    try:
        result = compile_grid_in_subprocess(jobs, workers=len(os.sched_getaffinity(0)))
    except MissingTool as err:
        pytest.skip(f"cannot compile for a GPU here: {err}")
    yield result
    print(_summary(result))


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("arch", list(TARGETS))
@pytest.mark.parametrize("launch,kernel", LAUNCHED, ids=[f"{launch}:{kernel}" for launch, kernel in LAUNCHED])
def test_kernel_compiles_within_device_limits(grid, launch, kernel, arch, shape):
    limits = TARGETS[arch]
    key = grid.keys.get((arch, shape, launch, kernel))
    assert key is not None, f"{launch} at {shape_id(shape)} did not launch {kernel}"
    built = grid.compiled[arch, key]
    where = f"{kernel} ({launch}) for {arch} ({limits.name}) at {shape_id(shape)}"
    assert built.cubin_bytes > 0, f"{where}: empty cubin"
    assert built.shared_bytes <= limits.max_shared_bytes, (
        f"{where}: {built.shared_bytes} bytes of shared memory per block, the device allows "
        f"{limits.max_shared_bytes}")
    assert built.regs <= limits.regs_per_thread, (
        f"{where}: {built.regs} registers per thread, the device allows {limits.regs_per_thread}")
    assert built.regs * built.threads <= limits.regs_per_block, (
        f"{where}: {built.regs} registers x {built.threads} threads = {built.regs * built.threads} per block, "
        f"the device allows {limits.regs_per_block}")


def test_every_jit_kernel_is_compiled():
    assert {kernel for _, kernel in LAUNCHED} == jit_kernel_names()


def _summary(result) -> str:
    """One row per distinct binary, with the shapes it serves."""
    served: dict[tuple, list[Shape]] = {}
    for (arch, shape, launch, kernel), key in result.keys.items():
        served.setdefault((kernel, launch, arch, key), []).append(shape)
    header = ("kernel", "launch", "target", "dtype", "head_dim", "group", "page", "tags", "context",
              "shared B", "regs", "regs x threads", "stack B", "cubin KB")
    rows = [header]
    for (kernel, launch, arch, key), shapes in sorted(served.items(), key=_row_order):
        built = result.compiled[arch, key]
        rows.append((kernel, launch, arch, *(_span([getattr(s, f) for s in shapes])
                                            for f in ("dtype", "head_dim", "group", "page_size", "check_tags", "context")),
                     str(built.shared_bytes), str(built.regs), str(built.regs * built.threads),
                     str(built.stack_bytes), f"{built.cubin_bytes / 1024:.0f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows]
    return "\n" + "\n".join(lines) + f"\n{len(rows) - 1} distinct binaries for {len(result.keys)} launches\n"


def _row_order(item) -> tuple:
    (kernel, launch, arch, _), shapes = item
    return kernel, launch, arch, min(shape_id(s) for s in shapes)


def _span(values) -> str:
    unique = sorted(set(values), key=lambda v: (str(type(v)), v))
    if all(isinstance(v, bool) for v in unique):
        return ",".join("on" if v else "off" for v in sorted(unique, reverse=True))
    if len(unique) > 2 and all(isinstance(v, int) for v in unique) and unique == list(range(unique[0], unique[-1] + 1)):
        return f"{unique[0]}-{unique[-1]}"
    return ",".join(str(v) for v in unique)
