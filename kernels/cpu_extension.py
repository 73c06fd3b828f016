"""The CPU kernels in csrc/ (the decode plan, decode attention in place, prefill attention,
RMSNorm, RoPE, the KV block digest): one C++ module.

Compiled once per machine with torch.utils.cpp_extension (g++ and ninja; 1–2 minutes on 2 cores) into
torch's extension cache (TORCH_EXTENSIONS_DIR, default ~/.cache/torch_extensions). `make`
builds it ahead (`python -m kernels.cpu_extension`); a process that finds it stale builds it,
and one that cannot (no compiler) runs the torch references and says why once.
PAGEWARDEN_CPU_KERNELS=reference forces the references (benches compare the two).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
from functools import cache
from pathlib import Path

import torch

log = logging.getLogger(__name__)

ENV_VAR = "PAGEWARDEN_CPU_KERNELS"
MODES = ("auto", "reference")
CSRC = Path(__file__).with_name("csrc")
SOURCES = tuple(CSRC / name for name in (
    "bindings.cpp", "decode_plan_cpu.cpp", "attention_cpu.cpp", "norm_rope_cpu.cpp", "block_digest_cpu.cpp"))
# -march=native: the build is for the machine that runs it (the cache is per machine).
# -ffp-contract=off: a*b + c stays two roundings, as in torch's eager ops (RoPE matches them
# bit for bit); the attention's vector paths (AVX-512, AVX2) ask for their FMAs explicitly.
# -fopenmp: at::parallel_for is inline OpenMP in ATen's headers; built without it, every
# kernel ran on one thread whatever torch.set_num_threads said. The module then uses the
# libgomp torch already loaded (the same soname), so there is one OpenMP runtime, one pool.
CFLAGS = ("-O3", "-march=native", "-fno-math-errno", "-ffp-contract=off", "-fopenmp")
LDFLAGS = ("-fopenmp",)


def mode() -> str:
    """The PAGEWARDEN_CPU_KERNELS setting; raises ValueError naming an unknown one."""
    value = os.environ.get(ENV_VAR) or "auto"
    if value not in MODES:
        raise ValueError(f"{ENV_VAR}={value!r} is not one of {', '.join(MODES)}")
    return value


_failure: list[str] = []  # why the module could not be built here (empty: it was, or it was not asked for)


@cache
def extension():
    """The compiled module (building it if stale), or None when it cannot be built here."""
    if mode() == "reference":
        return None
    try:
        module = compile_module(f"pagewarden_cpu_kernels_{build_key()}")
        runtimes = openmp_runtimes()
        if len(runtimes) > 1:  # e.g. clang's -fopenmp links libomp: torch's thread count no longer governs it
            raise RuntimeError(f"the module brought a second OpenMP runtime beside torch's: {', '.join(runtimes)}")
        return module
    except Exception as exc:  # no compiler, no ninja, a read-only cache: the references still work
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        log.warning("CPU kernels unavailable, running the torch references: %s", first)
        _failure[:] = [first[:300]]
        return None


def openmp_runtimes() -> list[str]:
    """The OpenMP runtimes mapped into this process (Linux; [] where /proc is not there)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    names = {line.split()[-1] for line in maps.splitlines() if line.count(" ") >= 5}
    return sorted(n for n in names if Path(n).name.startswith(("libgomp", "libomp", "libiomp")))


def build_failure() -> str:
    """Why this process runs the slow torch references although it asked for the module
    (its build failed), or "" (it runs the module, or PAGEWARDEN_CPU_KERNELS=reference chose
    the references on purpose). Workers say it in their hello; the supervisor raises it."""
    extension()
    return _failure[0] if _failure else ""


def compile_module(name: str, *, cflags: tuple[str, ...] = CFLAGS, ldflags: tuple[str, ...] = LDFLAGS,
                   build_directory: str | None = None):
    """Build (or find) csrc/ as the module `name` and import it. extension() is the engine's
    build; a test builds another with other flags (AddressSanitizer) into a folder of its own."""
    import fcntl

    from torch.utils.cpp_extension import _get_build_directory, load

    _put_ninja_on_path()
    folder = Path(build_directory or _get_build_directory(name, verbose=False))
    folder.mkdir(parents=True, exist_ok=True)
    # torch's own build lock is a plain file: a builder killed mid-build leaves it behind, and
    # every later process waits on it for ever (a vLLM start hung on one). Ours is an flock,
    # which the kernel drops with its holder: whoever holds it is the only builder, so a torch
    # lock file found then is stale and goes.
    with open(folder.parent / f"{folder.name}.build-lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        (folder / "lock").unlink(missing_ok=True)
        return load(name, [str(p) for p in SOURCES], extra_cflags=list(cflags), extra_ldflags=list(ldflags),
                    extra_include_paths=[str(CSRC)], build_directory=str(folder), verbose=False)


def build_key() -> str:
    """12 hex digits naming the build directory: this CPU's model and feature flags, where the
    sources are, what they say, the flags, and the interpreter and torch that build it. So a
    -march=native build is never handed to a CPU that lacks its instructions (a cache shared
    over NFS), and two checkouts, versions or virtual environments on one machine (a CI clone
    beside a working tree; the engine's venv beside vLLM's, whose include paths differ) each
    keep their own build instead of rebuilding over each other's in turn (torch's cache keys a
    build by name only)."""
    try:
        cpu = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        import platform

        cpu = [platform.processor(), platform.machine()]
    digest = hashlib.sha256()
    for line in sorted({line for line in cpu if line.startswith(("model name", "flags"))}):
        digest.update(line.encode())
    for path in (*SOURCES, CSRC / "cpu_kernels.h"):
        digest.update(str(path.resolve()).encode())
        digest.update(path.read_bytes())
    digest.update(" ".join(CFLAGS + LDFLAGS).encode())
    digest.update(f"{sys.prefix} {torch.__version__}".encode())
    return digest.hexdigest()[:12]


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


def usable(*tensors: torch.Tensor) -> bool:
    """Whether these tensors can go to the C++ kernels: float32 on the CPU, no gradient
    wanted through them (the kernels record no graph), and the module built."""
    # called for every norm, RoPE and attention of every step: plain loops over cheap
    # properties (a generator over t.device.type cost ~6% of a copy-model decode step)
    if extension() is None:
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if not t.is_cpu or t.dtype is not torch.float32 or (grad and t.requires_grad):
            return False
    return True


def describe() -> str:
    """What decode attention runs on this machine, for the worker's hello and the logs."""
    ext = extension()
    if ext is None:
        return "torch reference (gather + SDPA)"
    return f"in place, C++ ({ext.vector_isa() or 'plain loops'})"


def main() -> int:
    """Build (or find) the module; exit 1 when it cannot be built."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if extension() is None:
        print("the CPU kernels could not be built: the engine will run the torch references")
        return 1
    print(f"CPU kernels ready; decode attention: {describe()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
