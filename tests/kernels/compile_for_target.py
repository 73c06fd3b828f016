"""Build the Triton kernels for a GPU that is not here, exactly as the engine would launch them.

Each launcher in kernels/*_triton.py is called with CPU tensors laid out like the engine's
(page pool views, q/k/v sliced from one fused projection) while Triton's active driver is a
stand-in that names the target (sm_80, sm_90) and a jit_cache_hook records the compile
request (signature, constexprs, alignment attributes, options) instead of launching. Every
distinct request is then compiled by `triton.compile` for that target with the ptxas Triton
ships, and cuobjdump (also shipped) reads the registers from the cubin.

All of it runs in a fresh process (`compile_grid_in_subprocess`): a process that imported
Triton under TRITON_INTERPRET=1, as the test suite does on CPU machines, holds Triton's own
standard library (tl.max, tl.cdiv, ...) as interpreted functions and cannot compile for a GPU.
"""

from __future__ import annotations

import ast
import importlib
import json
import multiprocessing
import os
import pickle
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime import driver

REPO = Path(__file__).resolve().parents[2]
KERNELS_DIR = REPO / "kernels"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# the engine's layout around the kernels: per-layer cache views of a page-major pool
NUM_KV_HEADS, NUM_LAYERS, NUM_POOL_PAGES, BATCH = 8, 2, 64, 2


@dataclass(frozen=True)
class DeviceLimits:
    """Per-block limits of the smallest device of an architecture the engine targets."""

    name: str
    target: GPUTarget
    max_shared_bytes: int  # opt-in dynamic shared memory per block
    regs_per_block: int = 65536
    regs_per_thread: int = 255


TARGETS = {
    "sm_80": DeviceLimits("A100", GPUTarget("cuda", 80, 32), 166912),
    "sm_90": DeviceLimits("H100/H200", GPUTarget("cuda", 90, 32), 232448),
}


@dataclass(frozen=True)
class Shape:
    """One engine configuration the kernels are launched for."""

    dtype: str
    head_dim: int
    group: int  # query heads per kv head (GQA)
    page_size: int
    check_tags: bool
    context: int = 2048  # tokens in the block table (the engine's default context window)


@dataclass(frozen=True)
class CompileRequest:
    """What one launch asks Triton to compile; equal keys build the same binary."""

    module: str  # kernels.<file stem>
    kernel: str
    key: str  # Triton's own cache key of the launch: specialization and options
    signature: dict
    constexprs: dict
    attrs: dict
    options: dict


@dataclass(frozen=True)
class Compiled:
    cubin_bytes: int
    shared_bytes: int  # dynamic shared memory per block (metadata.shared)
    regs: int  # registers per thread, from the cubin
    stack_bytes: int  # per thread: the stack frame, where ptxas puts register spills
    threads: int  # per block


class MissingTool(RuntimeError):
    """A CUDA tool that Triton's wheel normally ships is not there."""


def jit_kernel_names() -> set[str]:
    """Every kernel decorated with @triton.jit in kernels/*_triton.py (read from the source);
    a jit function that another one calls is a device helper, compiled inside its callers."""
    names = set()
    for path in sorted(KERNELS_DIR.glob("*_triton.py")):
        jitted = [node for node in ast.walk(ast.parse(path.read_text()))
                  if isinstance(node, ast.FunctionDef) and any(
                      ast.unparse(dec).split("(")[0] in ("triton.jit", "jit") for dec in node.decorator_list)]
        called = {call.func.id for fn in jitted for call in ast.walk(fn)
                  if isinstance(call, ast.Call) and isinstance(call.func, ast.Name)}
        names.update(fn.name for fn in jitted if fn.name not in called)
    return names


class _TargetDriver:
    """Stands in for the CUDA driver: answers which GPU to compile for, launches nothing."""

    def __init__(self, target: GPUTarget):
        self.target = target

    def get_current_target(self) -> GPUTarget:
        return self.target

    def get_current_device(self):
        return f"compile-only-{self.target.arch}"  # its own per-device kernel cache

    def get_current_stream(self, device=None) -> int:
        return 0


@contextmanager
def _capturing(target: GPUTarget) -> Iterator[list[CompileRequest]]:
    requests: list[CompileRequest] = []

    def record(*, key, fn, compile, **_):
        spec = json.loads(compile["specialization_data"])
        requests.append(CompileRequest(
            module=fn.module, kernel=fn.name, key=str(key), signature=compile["signature"],
            constexprs=compile["constants"], attrs=compile["configs"][0], options=_tuples(spec["options"]),
        ))
        return True  # handled: Triton neither compiles nor launches

    saved_driver, saved_hook = driver._active, knobs.runtime.jit_cache_hook
    driver.set_active(_TargetDriver(target))
    knobs.runtime.jit_cache_hook = record
    try:
        yield requests
    finally:
        knobs.runtime.jit_cache_hook = saved_hook
        driver._active = saved_driver


def _tuples(value):
    """Options come back from JSON with lists where Triton hashes tuples."""
    if isinstance(value, dict):
        return {k: _tuples(v) for k, v in value.items()}
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def launch_requests(target: GPUTarget, shape: Shape) -> dict[str, list[CompileRequest]]:
    """Call every launcher at `shape` with engine-laid-out CPU tensors; return the compile
    requests each made, by launch name (one launcher may run several kernels)."""
    attention, store, scrub, digest = (importlib.import_module(f"kernels.{stem}") for stem in (
        "paged_attention_triton", "kv_store_triton", "scrub_triton", "block_digest_triton"))
    dtype, d, ps, kv = DTYPES[shape.dtype], shape.head_dim, shape.page_size, NUM_KV_HEADS
    heads = kv * shape.group
    # page-major pool, data[page, layer, k|v, token, kv_head, dim], as engine/kv/page_pool.py
    data = torch.empty(NUM_POOL_PAGES, NUM_LAYERS, 2, ps, kv, d, dtype=dtype)
    k_cache, v_cache = data[:, 1, 0], data[:, 1, 1]
    token_writer = torch.zeros(NUM_POOL_PAGES, ps, dtype=torch.int64)
    writer = torch.zeros(NUM_POOL_PAGES, dtype=torch.int64)
    filled = torch.zeros(NUM_POOL_PAGES, dtype=torch.int32)
    # q, k, v as engine/model/layers.py Attention.forward slices them from one projection
    qkv = torch.empty(BATCH, (heads + 2 * kv) * d, dtype=dtype)
    qk = torch.empty(BATCH, heads + kv, d, dtype=dtype)  # apply_rope's fresh output
    q, k, v = qk[:, :heads], qk[:, heads:], qkv[:, (heads + kv) * d:].view(BATCH, kv, d)
    width = triton.cdiv(shape.context, ps)
    block_table = torch.zeros(BATCH, width, dtype=torch.int32)
    expected = torch.zeros(BATCH, width, dtype=torch.int64)
    seq_lens = torch.full((BATCH,), shape.context, dtype=torch.int32)
    slots = torch.zeros(BATCH, dtype=torch.int64)
    tags = torch.zeros(BATCH, dtype=torch.int64)
    pages = torch.zeros(3, dtype=torch.int64)
    valid = torch.full((3,), ps, dtype=torch.int32)
    launches = {
        "decode": lambda: attention.paged_decode_attention(
            q, k_cache, v_cache, block_table, expected, seq_lens, token_writer,
            scale=d ** -0.5, check_tags=shape.check_tags),
        # the first layer's store stamps the tags, the others do not: both run every step
        "store stamp": lambda: store.store_kv(k_cache, v_cache, k, v, slots, tags, writer, filled, token_writer,
                                              stamp=True),
        "store": lambda: store.store_kv(k_cache, v_cache, k, v, slots, tags, writer, filled, token_writer,
                                        stamp=False),
        "scrub": lambda: scrub.scrub_pages(data, pages, 0.0),
        # the transfer digest over one layer's K, over K and V of a block as one row of two
        # segments, and over rows that are not whole 8-byte chunks (read byte by byte)
        "digest": lambda: digest.block_digest(k_cache, pages, valid),
        "digest k+v": lambda: digest.block_digest(data[:, 1].transpose(1, 2), pages, valid),
        "digest odd rows": lambda: digest.block_digest(k_cache[..., : d - 1], pages, valid),
    }
    found = {}
    for name, launch in launches.items():
        with _capturing(target) as requests:
            launch()
        found[name] = requests
    return found


def compile_request(arch: str, request: CompileRequest) -> Compiled:
    """Compile one request for TARGETS[arch]; read shared memory, registers and spills.
    Raises MissingTool when ptxas or cuobjdump is not where Triton keeps them."""
    tools = cuda_tools()
    target = TARGETS[arch].target
    kernel = getattr(importlib.import_module(request.module), request.kernel)
    source = ASTSource(kernel, request.signature, request.constexprs, request.attrs)
    compiled = triton.compile(source, target=target, options=request.options)
    cubin = compiled.asm["cubin"]
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        usage = subprocess.run([tools["cuobjdump"], "--dump-resource-usage", file.name],
                               capture_output=True, text=True, check=True).stdout
    match = re.search(r"Function \S+:\s*REG:(\d+) STACK:(\d+)", usage)
    if match is None:
        raise RuntimeError(f"no resource usage for {request.kernel} in cuobjdump's output:\n{usage}")
    return Compiled(len(cubin), compiled.metadata.shared, int(match[1]), int(match[2]),
                    compiled.metadata.num_warps * target.warp_size)


def cuda_tools() -> dict[str, str]:
    """Paths of ptxas and cuobjdump. Raises MissingTool naming the one that is missing."""
    tools = {}
    for name in ("ptxas", "cuobjdump"):
        try:
            tools[name] = getattr(knobs.nvidia, name).path
        except RuntimeError as err:
            raise MissingTool(f"{name} is missing (Triton's wheel ships it in triton/backends/nvidia/bin; "
                              f"TRITON_{name.upper()}_PATH overrides): {err}") from None
    return tools


@dataclass
class GridResult:
    """keys[(arch, shape, launch, kernel)] names the binary in compiled[(arch, key)]."""

    keys: dict[tuple[str, Shape, str, str], str]
    compiled: dict[tuple[str, str], Compiled]


def compile_grid(jobs: list[tuple[str, Shape]], workers: int) -> GridResult:
    """Capture what every launcher asks for at each (arch, shape), then compile each distinct
    request once, `workers` at a time. Raises RuntimeError under TRITON_INTERPRET."""
    if knobs.runtime.interpret:
        raise RuntimeError("TRITON_INTERPRET is set: the kernels would be interpreted, not compiled")
    keys, distinct = {}, {}
    for arch, shape in jobs:
        for launch, requests in launch_requests(TARGETS[arch].target, shape).items():
            for request in requests:
                keys[arch, shape, launch, request.kernel] = request.key
                distinct.setdefault((arch, request.key), request)
    cuda_tools()  # fail once, by name, before any worker starts
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        results = pool.map(compile_request, *zip(*((arch, req) for (arch, _), req in distinct.items())))
        return GridResult(keys, dict(zip(distinct, results)))


def compile_grid_in_subprocess(jobs: list[tuple[str, Shape]], workers: int) -> GridResult:
    """compile_grid in a fresh Python without TRITON_INTERPRET. Raises MissingTool when a
    CUDA tool is missing, RuntimeError with the child's stderr for anything else."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.pickle"
        proc = subprocess.run(
            [sys.executable, "-m", "tests.kernels.compile_for_target", str(out), str(workers)],
            input=pickle.dumps(jobs), cwd=REPO, env=env, capture_output=True, check=False,
        )
        stderr = proc.stderr.decode(errors="replace")
        if proc.returncode == _MISSING_TOOL_EXIT:
            raise MissingTool(stderr.strip().splitlines()[-1])
        if proc.returncode != 0:
            raise RuntimeError(f"compiling for the GPU targets failed (exit {proc.returncode}):\n{stderr[-6000:]}")
        return pickle.loads(out.read_bytes())


_MISSING_TOOL_EXIT = 3


def main(argv: list[str]) -> int:
    out, workers = Path(argv[0]), int(argv[1])
    jobs = pickle.loads(sys.stdin.buffer.read())
    try:
        result = compile_grid(jobs, workers)
    except MissingTool as err:
        print(err, file=sys.stderr)
        return _MISSING_TOOL_EXIT
    out.write_bytes(pickle.dumps(result))
    return 0


if __name__ == "__main__":
    from tests.kernels.compile_for_target import main as _main  # pickles name this module, not __main__

    sys.exit(_main(sys.argv[1:]))
