"""Loading a local HF checkpoint: every bad input gets an error naming the file or field."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.config import DEFAULT_MODEL_DIR, TINY_RANDOM_MODEL_DIR, EngineConfig
from engine.core import Engine
from engine.errors import CheckpointError, ConfigError
from engine.model.load import load_model


@pytest.fixture
def model_copy(tmp_path):
    dest = tmp_path / "model"
    shutil.copytree(TINY_RANDOM_MODEL_DIR, dest)  # 4 layers, grouped-query attention
    return dest


def _edit_config(model_dir, **changes):
    path = model_dir / "config.json"
    cfg = json.loads(path.read_text())
    cfg.update(changes)
    path.write_text(json.dumps(cfg))


def test_unsupported_architecture_lists_the_supported_ones(model_copy):
    _edit_config(model_copy, architectures=["GPT2LMHeadModel"])
    with pytest.raises(CheckpointError) as err:
        load_model(model_copy, device="cpu")
    msg = str(err.value)
    assert "'GPT2LMHeadModel' is not supported" in msg
    assert "LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM" in msg


@pytest.mark.parametrize("missing", ["config.json", "model.safetensors"])
def test_missing_file_is_named(model_copy, missing):
    (model_copy / missing).unlink()
    with pytest.raises(CheckpointError, match=f"missing file: .*{missing}"):
        load_model(model_copy, device="cpu")


def test_missing_directory_is_named(tmp_path):
    with pytest.raises(CheckpointError, match="model directory not found: .*absent"):
        load_model(tmp_path / "absent")


def test_missing_shard_is_named(model_copy):
    (model_copy / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(CheckpointError, match="missing file: .*model-00002-of-00002.safetensors"):
        load_model(model_copy, device="cpu")


def test_missing_and_misshapen_tensors_are_named(model_copy):
    weights = load_file(model_copy / "model.safetensors")
    del weights["model.layers.2.mlp.up_proj.weight"]
    save_file(weights, model_copy / "model.safetensors")
    with pytest.raises(CheckpointError, match="first: model.layers.2.mlp.up_proj.weight"):
        load_model(model_copy, device="cpu")
    weights["model.layers.2.mlp.up_proj.weight"] = torch.zeros(384, 64)
    save_file(weights, model_copy / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"model.layers.2.mlp.up_proj.weight has shape \(384, 64\), expected \(384, 128\)"):
        load_model(model_copy, device="cpu")


def test_corrupt_weights_file(model_copy):
    (model_copy / "model.safetensors").write_bytes(b"\x10\x00\x00\x00garbage")
    with pytest.raises(CheckpointError, match="cannot read safetensors"):
        load_model(model_copy, device="cpu")


def test_bad_config_fields(model_copy):
    _edit_config(model_copy, rope_parameters={"rope_type": "yarn", "factor": 4.0})
    with pytest.raises(CheckpointError, match="rope type 'yarn' is not supported"):
        load_model(model_copy, device="cpu")
    _edit_config(model_copy, rope_parameters={"rope_type": "default", "rope_theta": 1e4}, num_key_value_heads=3)
    with pytest.raises(CheckpointError, match="num_attention_heads 4 is not a multiple of num_key_value_heads 3"):
        load_model(model_copy, device="cpu")
    cfg = json.loads((model_copy / "config.json").read_text())
    del cfg["hidden_size"]
    (model_copy / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="missing field 'hidden_size'"):
        load_model(model_copy, device="cpu")
    (model_copy / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json: not valid JSON"):
        load_model(model_copy, device="cpu")


@pytest.mark.parametrize("changes, message", [
    ({"hidden_size": "abc"}, "hidden_size must be an integer, got 'abc'"),
    ({"num_attention_heads": 0}, "num_attention_heads = 0 is out of range: must be between 1 and 1,024"),
    ({"rope_parameters": "yes"}, "rope_parameters must be an object, got 'yes'"),
    ({"vocab_size": 10**12}, "vocab_size = 1,000,000,000,000 is out of range"),
    ({"num_hidden_layers": True}, "num_hidden_layers must be an integer, got True"),
    ({"rms_norm_eps": "tiny"}, "rms_norm_eps must be a number between 0 and 1, got 'tiny'"),
    ({"eos_token_id": ["x"]}, "eos_token_id must be a token id or a list of them"),
    ({"architectures": "LlamaForCausalLM"}, "architecture None is not supported"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": -1}}, "rope_theta must be a number between 1"),
])
def test_hostile_config_fields_are_named_with_value_and_limit(model_copy, changes, message):
    """Issue 14, item 10: these gave ValueError, ZeroDivisionError, AttributeError tracebacks."""
    _edit_config(model_copy, **changes)
    with pytest.raises(CheckpointError, match=re.escape(message)):
        load_model(model_copy, device="cpu")


def test_a_config_json_that_is_not_an_object(model_copy):
    (model_copy / "config.json").write_text("[1, 2, 3]")
    with pytest.raises(CheckpointError, match="config.json: must be a JSON object, got list"):
        load_model(model_copy, device="cpu")


def test_tokenizer_is_needed_only_for_text(model_copy):
    (model_copy / "tokenizer.json").unlink()
    model = load_model(model_copy, device="cpu")  # token ids need no tokenizer
    with pytest.raises(CheckpointError, match="missing file: .*tokenizer.json"):
        model.tokenizer.encode("hello")


def test_dtype_and_device_flags(model_copy):
    with pytest.raises(ConfigError, match="dtype 'float64' is not one of auto, float32, bfloat16, float16"):
        load_model(model_copy, dtype="float64")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="device 'cuda' asked for, but this machine has no usable CUDA device"):
            load_model(model_copy, device="cuda")
    _edit_config(model_copy, dtype="bfloat16")
    assert load_model(model_copy, device="cpu").dtype == torch.bfloat16  # from config.json
    assert load_model(model_copy, dtype="float32", device="cpu").dtype == torch.float32  # flag wins


def test_byte_level_tokenizer_round_trips_any_text():
    tok = load_model(DEFAULT_MODEL_DIR, device="cpu").tokenizer
    text = "Repeat: naïve café — 東京 🚀 \x00\ttabs"
    ids = tok.encode(text)
    assert ids[0] == 256  # BOS
    assert all(0 <= i < 256 for i in ids[1:]) and len(ids) - 1 == len(text.encode("utf-8"))
    assert tok.decode(ids) == text


def test_sliding_window_smaller_than_the_context_window_is_refused(checkpoint_dirs, tmp_path):
    model_dir = tmp_path / "mistral"
    shutil.copytree(checkpoint_dirs["mistral-mqa"], model_dir)
    _edit_config(model_dir, sliding_window=64)
    config = EngineConfig().replace(model={"path": str(model_dir), "device": "cpu"}, engine={"context_window": 256})
    with pytest.raises(ConfigError, match="context window 256 exceeds the model's sliding window 64"):
        Engine(config)
    Engine(config.replace(engine={"context_window": 64}))  # within the window it runs


def test_tiny_random_model_is_small_and_regenerates_byte_identically(tmp_path):
    import subprocess
    import sys

    size = sum(p.stat().st_size for p in TINY_RANDOM_MODEL_DIR.iterdir())
    assert size < 8 * 2**20
    script = TINY_RANDOM_MODEL_DIR.parent / "make_tiny_random.py"
    subprocess.run([sys.executable, str(script), "--out", str(tmp_path / "m")], check=True, capture_output=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (tmp_path / "m" / name).read_bytes() == (TINY_RANDOM_MODEL_DIR / name).read_bytes(), name
