"""load_model: config.json + safetensors (+ tokenizer.json when text is used) -> LoadedModel."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.config import CPU_WEIGHT_LAYOUTS
from engine.errors import CheckpointError, ConfigError
from engine.model.checkpoint import TORCH_DTYPES, load_decoder
from engine.model.config import ModelConfig, read_model_config
from engine.model.cpu_linear import pack_linears
from engine.model.decoder import CausalDecoder
from engine.model.tokenizer import TextTokenizer


@dataclass
class LoadedModel:
    path: Path
    config: ModelConfig
    decoder: CausalDecoder
    dtype: torch.dtype
    device: torch.device
    _tokenizer: TextTokenizer | None = field(default=None, repr=False)

    @property
    def tokenizer(self) -> TextTokenizer:
        """Loaded on first use: a model driven by token ids needs no tokenizer.json."""
        if self._tokenizer is None:
            self._tokenizer = TextTokenizer.from_dir(self.path)
        return self._tokenizer


def resolve_device(name: str) -> torch.device:
    """'auto' -> cuda when available, else cpu. Raises ConfigError for an absent CUDA device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device {name!r} asked for, but this machine has no usable CUDA device")
        index = device.index or 0
        if index >= torch.cuda.device_count():
            raise ConfigError(
                f"device {name!r} asked for, but only {torch.cuda.device_count()} CUDA device(s) exist"
            )
    return device


def resolve_dtype(name: str, cfg: ModelConfig) -> torch.dtype:
    if name == "auto":
        name = cfg.dtype
    if name not in TORCH_DTYPES:
        raise ConfigError(f"dtype {name!r} is not one of auto, {', '.join(TORCH_DTYPES)}")
    return TORCH_DTYPES[name]


def load_model(
    model_dir: str | Path,
    *,
    dtype: str = "auto",
    device: str = "auto",
    max_positions: int | None = None,
    cpu_weight_layout: str = "packed",
) -> LoadedModel:
    """Load a local HF checkpoint directory. Raises CheckpointError (missing file, unsupported
    architecture, bad tensor) or ConfigError (dtype/device/layout).

    cpu_weight_layout "packed": on CPU in float32, large projection weights are held in
    oneDNN's packed layout (engine/model/cpu_linear.py); "plain" keeps nn.Linear."""
    if cpu_weight_layout not in CPU_WEIGHT_LAYOUTS:
        raise ConfigError(f"cpu_weight_layout {cpu_weight_layout!r} is not one of {', '.join(CPU_WEIGHT_LAYOUTS)}")
    path = Path(model_dir)
    cfg = read_model_config(path)
    torch_dtype = resolve_dtype(dtype, cfg)
    torch_device = resolve_device(device)
    positions = max(max_positions or 0, cfg.max_position_embeddings)
    if positions <= 0:
        raise CheckpointError(f"{path}: max_position_embeddings must be positive")
    decoder = load_decoder(
        path, cfg, dtype=torch_dtype, device=torch_device, max_positions=positions
    )
    if cpu_weight_layout == "packed":
        pack_linears(decoder)
    return LoadedModel(path, cfg, decoder, torch_dtype, torch_device)
