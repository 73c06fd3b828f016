"""Check a checkpoint directory without loading it (no torch): config.json is readable and
its architecture supported, and every weights file named is there with a readable
safetensors header. What a supervisor can validate before it tells workers to load a model."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from engine.errors import CheckpointError
from engine.model.config import ModelConfig, read_model_config

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
MAX_HEADER = 100 << 20  # a safetensors header (JSON) larger than this is not a checkpoint of ours
MAX_INDEX = 50 << 20


def precheck(model_dir: str | Path) -> ModelConfig:
    """The checkpoint's ModelConfig; CheckpointError naming the file and what is wrong."""
    model_dir = Path(model_dir)
    config = read_model_config(model_dir)
    index = model_dir / INDEX_FILE
    if index.is_file():
        if index.stat().st_size > MAX_INDEX:
            raise CheckpointError(f"{index}: {index.stat().st_size:,} bytes is not a shard index")
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(f"{index}: not a valid shard index ({type(exc).__name__})") from None
        files = [model_dir / str(shard) for shard in shards]
    else:
        files = [model_dir / SINGLE_FILE]
    for path in files:
        _header(path)
    return config


def _header(path: Path) -> dict:
    if not path.is_file():
        raise CheckpointError(f"missing file: {path}")
    try:
        with open(path, "rb") as f:
            raw_len = f.read(8)
            (length,) = struct.unpack("<Q", raw_len) if len(raw_len) == 8 else (None,)
            if length is None or not 2 <= length <= min(MAX_HEADER, path.stat().st_size - 8):
                raise CheckpointError(f"{path}: not a safetensors file (header length {length})")
            header = json.loads(f.read(length))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: cannot read safetensors header ({type(exc).__name__})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: safetensors header is not a JSON object")
    return header
