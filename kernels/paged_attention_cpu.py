"""Paged decode attention on the CPU, in place: the C++ kernel in csrc/paged_attention_cpu.cpp.

The torch reference (paged_attention_ref) copies every page a step reads into a private
buffer before SDPA, in every layer. This kernel reads each readable token where it lies and
never touches a blocked one; it takes the same DecodePlan, so the I1 check, the mask and the
violation counts stay in one place (plan_decode).

It is compiled once per machine with torch.utils.cpp_extension (g++ and ninja; about 40 s)
into torch's extension cache (TORCH_EXTENSIONS_DIR, default ~/.cache/torch_extensions).
`make` builds it ahead (`python -m kernels.paged_attention_cpu`); a process that finds it
stale builds it, and one that cannot (no compiler) falls back to the reference and says
why. PAGEWARDEN_CPU_ATTENTION=reference forces the reference (benches compare the two).
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from functools import cache
from pathlib import Path

import torch

from kernels import paged_attention_ref

log = logging.getLogger(__name__)

ENV_VAR = "PAGEWARDEN_CPU_ATTENTION"
MODES = ("auto", "reference")
SOURCE = Path(__file__).with_name("csrc") / "paged_attention_cpu.cpp"
# -march=native: the build is for the machine that runs it (the cache is per machine)
CFLAGS = ("-O3", "-march=native", "-fno-math-errno")


def mode() -> str:
    """The PAGEWARDEN_CPU_ATTENTION setting; raises ValueError naming an unknown one."""
    value = os.environ.get(ENV_VAR) or "auto"
    if value not in MODES:
        raise ValueError(f"{ENV_VAR}={value!r} is not one of {', '.join(MODES)}")
    return value


@cache
def extension():
    """The compiled module (building it if stale), or None when it cannot be built here."""
    if mode() == "reference":
        return None
    try:
        from torch.utils.cpp_extension import load

        _put_ninja_on_path()
        return load("pagewarden_paged_attention_cpu", [str(SOURCE)], extra_cflags=list(CFLAGS), verbose=False)
    except Exception as exc:  # no compiler, no ninja, a read-only cache: the reference still works
        log.warning("CPU attention kernel unavailable, using the torch reference: %s", str(exc).splitlines()[0]
                    if str(exc) else type(exc).__name__)
        return None


def _put_ninja_on_path() -> None:
    """torch runs `ninja` from PATH; pip's ninja lives beside this interpreter, which a
    process started as .venv/bin/python does not have on its PATH."""
    if shutil.which("ninja") is not None:
        return
    try:
        import ninja
    except ImportError:
        return
    os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR, os.environ.get("PATH", "")])


def usable(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether this step can run in the kernel: float32 on the CPU, and the kernel built."""
    return (q.device.type == "cpu" and q.dtype == torch.float32 and k_cache.dtype == torch.float32
            and k_cache.stride(3) == 1 and extension() is not None)


def attend_planned(q, k_cache, v_cache, plan, *, scale: float, out: torch.Tensor | None = None,
                   vectorized: bool = True) -> torch.Tensor:
    """One layer's decode attention through plan (kernels.paged_attention_ref.DecodePlan).

    In the kernel where usable(), else through the reference; either way it reads only the
    slots the plan leaves unblocked and a row with none is zero. vectorized=False forces the
    kernel's plain loops. Raises RuntimeError (from the kernel) naming a shape, dtype or page
    that does not fit.
    """
    if not usable(q, k_cache):
        return paged_attention_ref.attend_planned(q, k_cache, v_cache, plan, scale=scale, out=out)
    target = out if out is not None and out.is_contiguous() else torch.empty(q.shape, dtype=q.dtype)
    batch = q.shape[0]
    extension().paged_decode(q.contiguous(), k_cache, v_cache, plan.pages,
                             plan.blocked.view(batch, -1), float(scale), target, vectorized)
    if out is None:
        return target
    if target is not out:
        out.copy_(target)
    return out


def describe() -> str:
    """What decode attention runs on this machine, for the worker's hello and the logs."""
    ext = extension()
    if ext is None:
        return "torch reference (gather + SDPA)"
    return f"in place, C++ ({'AVX-512' if ext.vectorized_for(128) else 'plain loops'})"


def main() -> int:
    """Build (or find) the kernel; exit 1 when it cannot be built."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ext = extension()
    if ext is None:
        print("the CPU attention kernel could not be built: the engine will use the torch reference")
        return 1
    print(f"CPU attention kernel ready: {describe()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
