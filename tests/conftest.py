"""Test-wide settings: no display, the Triton interpreter on machines without CUDA."""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# Must precede the first import of a module holding @triton.jit functions.
if not os.path.exists("/dev/nvidia0"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from tests.hf_checkpoints import ARCH_CASES, write_random_checkpoint  # noqa: E402


@pytest.fixture(scope="session")
def checkpoint_dirs(tmp_path_factory) -> dict[str, Path]:
    """One random HF checkpoint per case of ARCH_CASES, written by transformers itself."""
    root = tmp_path_factory.mktemp("checkpoints")
    return {name: write_random_checkpoint(root / name, **case) for name, case in ARCH_CASES.items()}


@pytest.fixture(scope="session")
def tiny_model():
    """The embedded default model on CPU in float32, shared (engines get their own pools)."""
    from engine.config import DEFAULT_MODEL_DIR
    from engine.model.load import load_model

    return load_model(DEFAULT_MODEL_DIR, dtype="float32", device="cpu")


@pytest.fixture
def make_engine(tiny_model):
    """make_engine(context_window=..., prefill_pages=..., decode_pages=..., **engine_keys)."""
    from engine.config import EngineConfig
    from engine.core import Engine

    def make(*, prefill_pages: int = 256, decode_pages: int = 256, defences=None, faults=None,
             **engine_keys) -> Engine:
        config = EngineConfig().replace(
            model={"device": "cpu", "dtype": "float32"},
            engine={"kernels": "torch", **engine_keys},
            pools={"prefill": {"pages": prefill_pages}, "decode": {"pages": decode_pages}},
            defences=defences or {}, faults=faults or {},
        )
        return Engine(config, tiny_model)

    return make
