"""Pick the kernel implementations for a device: Triton on CUDA, plain torch elsewhere."""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Callable

import torch

CHOICES = ("auto", "triton", "torch")
ENV_VAR = "PAGEWARDEN_KERNELS"
_TRITON_MODULES = ("kernels.paged_attention_triton", "kernels.kv_store_triton", "kernels.scrub_triton")


@dataclass(frozen=True)
class KernelSet:
    """The three kernels the engine calls, from one backend."""

    name: str
    paged_decode_attention: Callable
    store_kv: Callable
    scrub_pages: Callable
    # Optional split of paged_decode_attention into a once-per-step plan (tags, mask,
    # violations) and a per-layer attend; the torch path uses it to check I1 once per
    # step instead of once per layer. None where the kernel checks in every layer.
    plan_decode: Callable | None = None
    attend_planned: Callable | None = None
    # Likewise for the store: resolve slots once per step, stamp tags once, then write
    # each layer's K/V. None where store_kv is one cheap launch per layer.
    plan_store: Callable | None = None
    store_planned: Callable | None = None
    # what decode attention runs on, in words (the worker's hello says it)
    attention: str = ""
    # why this set runs slower code than the machine could (the CPU module failed to build): "" when not
    fallback: str = ""


def select_kernels(choice: str, device) -> KernelSet:
    """Return the KernelSet for `choice` ("auto", "triton" or "torch") on `device`.

    The PAGEWARDEN_KERNELS environment variable, when set, overrides `choice`. "auto" is
    Triton on CUDA and torch elsewhere; "triton" off CUDA runs the Triton interpreter
    (slow: for tests). Raises ValueError for an unknown choice, ImportError when Triton is
    needed but not installed, RuntimeError when the interpreter is needed but the Triton
    kernel modules were already imported without it.
    """
    choice = os.environ.get(ENV_VAR) or choice
    if choice not in CHOICES:
        raise ValueError(f"unknown kernel backend {choice!r}; allowed: {', '.join(CHOICES)}")
    on_cuda = torch.device(device).type == "cuda"
    if choice == "torch" or (choice == "auto" and not on_cuda):
        return _torch_kernels()
    return _triton_kernels(interpret=not on_cuda)


def _torch_kernels() -> KernelSet:
    """The CPU path: torch for stores and scrubs; the decode step's I1 plan and attention in
    C++ where the module builds (kernels.cpu_extension), else the torch references."""
    from kernels import cpu_extension, paged_attention_cpu
    from kernels.kv_store_ref import plan_store, store_kv, store_planned
    from kernels.paged_attention_ref import paged_decode_attention
    from kernels.scrub_ref import scrub_pages

    return KernelSet(
        "torch", paged_decode_attention, store_kv, scrub_pages,
        paged_attention_cpu.plan_decode, paged_attention_cpu.attend_planned, plan_store, store_planned,
        attention=cpu_extension.describe(), fallback=cpu_extension.build_failure(),
    )


def _triton_kernels(*, interpret: bool) -> KernelSet:
    if interpret:
        # read by @triton.jit when the kernel modules are first imported below
        os.environ["TRITON_INTERPRET"] = "1"
    attention, store, scrub = (importlib.import_module(name) for name in _TRITON_MODULES)
    if interpret and not all(_is_interpreted(kernel) for kernel in (
        attention._decode_partition_kernel, store._store_kv_kernel, scrub._scrub_pages_kernel,
    )):
        raise RuntimeError(
            f"Triton kernels are needed on CPU, but {', '.join(_TRITON_MODULES)} were imported "
            "without TRITON_INTERPRET=1; set it before anything imports them"
        )
    return KernelSet("triton", attention.paged_decode_attention, store.store_kv, scrub.scrub_pages,
                     attention="Triton" + (" (interpreted)" if interpret else ""))


def _is_interpreted(kernel) -> bool:
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(kernel, InterpretedFunction)
