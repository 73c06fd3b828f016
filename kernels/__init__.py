"""KV kernels: Triton for CUDA, torch references for everything else (see kernels.backend)."""

from kernels.backend import KernelSet, select_kernels

__all__ = ["KernelSet", "select_kernels"]
