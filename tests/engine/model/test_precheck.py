"""The supervisor's torch-free check of a checkpoint directory (issue 14, item 6)."""

from __future__ import annotations

import json
import shutil

import pytest

from engine.config import TINY_RANDOM_MODEL_DIR
from engine.errors import CheckpointError
from engine.model.precheck import precheck


@pytest.fixture
def model(tmp_path):
    dest = tmp_path / "m"
    shutil.copytree(TINY_RANDOM_MODEL_DIR, dest)
    return dest


def test_a_good_checkpoint_passes(model):
    assert precheck(model).architecture in ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")


def test_missing_or_garbled_weights_are_named(model):
    weights = model / "model.safetensors"
    weights.write_bytes(b"\xff" * 64)
    with pytest.raises(CheckpointError, match="not a safetensors file"):
        precheck(model)
    weights.unlink()
    with pytest.raises(CheckpointError, match="missing file: .*model.safetensors"):
        precheck(model)
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "shard-1.safetensors"}}))
    with pytest.raises(CheckpointError, match="missing file: .*shard-1.safetensors"):
        precheck(model)
    (model / "model.safetensors.index.json").write_text("[]")
    with pytest.raises(CheckpointError, match="not a valid shard index"):
        precheck(model)
