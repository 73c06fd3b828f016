"""ModelConfig: the parts of a Hugging Face config.json our decoder needs, checked."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from engine.errors import CheckpointError

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")
_DTYPE_NAMES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    dtype: str  # the checkpoint's declared dtype
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    sliding_window: int | None

    @property
    def group_size(self) -> int:
        return self.num_heads // self.num_kv_heads


def read_model_config(model_dir: Path) -> ModelConfig:
    """Parse `<model_dir>/config.json`. Raises CheckpointError naming the file and the field."""
    path = Path(model_dir) / "config.json"
    if not Path(model_dir).is_dir():
        raise CheckpointError(f"model directory not found: {model_dir}")
    if not path.is_file():
        raise CheckpointError(f"missing file: {path}")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON: {exc}") from None
    return model_config_from_dict(raw, source=str(path))


# Sizes a config.json may declare: anything outside is a broken (or hostile) file, refused
# before a tensor is allocated from it.
_LIMITS = {
    "vocab_size": (1, 1 << 24), "hidden_size": (1, 1 << 17), "intermediate_size": (1, 1 << 20),
    "num_hidden_layers": (1, 1024), "num_attention_heads": (1, 1024), "num_key_value_heads": (1, 1024),
    "head_dim": (1, 4096), "max_position_embeddings": (1, 1 << 31), "sliding_window": (1, 1 << 31),
}


def _int_field(raw: dict, key: str, source: str, default=None) -> int:
    """raw[key] as an int within _LIMITS[key]; CheckpointError naming the field, the value
    and the limit."""
    value = raw.get(key, default)
    if value is None:
        raise CheckpointError(f"{source}: missing field '{key}'")
    if isinstance(value, bool) or not isinstance(value, int):
        raise CheckpointError(f"{source}: {key} must be an integer, got {value!r}")
    low, high = _LIMITS[key]
    if not low <= value <= high:
        raise CheckpointError(f"{source}: {key} = {value:,} is out of range: must be between {low:,} and {high:,}")
    return value


def model_config_from_dict(raw: dict, *, source: str = "config.json") -> ModelConfig:
    if not isinstance(raw, dict):
        raise CheckpointError(f"{source}: must be a JSON object, got {type(raw).__name__}")
    archs = raw.get("architectures") or []
    arch = archs[0] if isinstance(archs, list) and archs else None
    if not isinstance(arch, str) or arch not in SUPPORTED_ARCHITECTURES:
        raise CheckpointError(
            f"{source}: architecture {arch!r} is not supported; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )

    def need(key: str):
        return _int_field(raw, key, source)

    hidden = need("hidden_size")
    heads = need("num_attention_heads")
    kv_heads = _int_field(raw, "num_key_value_heads", source, default=heads)
    head_dim = _int_field(raw, "head_dim", source, default=hidden // heads if hidden >= heads else None)
    if heads % kv_heads:
        raise CheckpointError(
            f"{source}: num_attention_heads {heads} is not a multiple of "
            f"num_key_value_heads {kv_heads}"
        )
    is_qwen2 = arch == "Qwen2ForCausalLM"
    eos = raw.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
    bos = raw.get("bos_token_id")
    for key, ids in (("eos_token_id", eos_ids), ("bos_token_id", () if bos is None else (bos,))):
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
            raise CheckpointError(f"{source}: {key} must be a token id or a list of them, got {raw.get(key)!r}")
    eps = raw.get("rms_norm_eps", 1e-6)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
        raise CheckpointError(f"{source}: rms_norm_eps must be a number between 0 and 1, got {eps!r}")
    return ModelConfig(
        architecture=arch,
        vocab_size=need("vocab_size"),
        hidden_size=hidden,
        intermediate_size=need("intermediate_size"),
        num_layers=need("num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=float(eps),
        rope_theta=_rope_theta(raw, source),
        max_position_embeddings=_int_field(raw, "max_position_embeddings", source, default=2048),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        # Qwen2 always has q/k/v bias; Llama declares it with attention_bias (o_proj too).
        qkv_bias=is_qwen2 or bool(raw.get("attention_bias", False)),
        o_bias=(not is_qwen2) and bool(raw.get("attention_bias", False)),
        mlp_bias=bool(raw.get("mlp_bias", False)),
        dtype=_declared_dtype(raw),
        bos_token_id=bos,
        eos_token_ids=eos_ids,
        sliding_window=_sliding_window(raw, is_qwen2),
    )


def _rope_theta(raw: dict, source: str) -> float:
    # transformers 5 writes rope_parameters; older checkpoints write rope_theta (+ rope_scaling).
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise CheckpointError(f"{source}: rope_parameters must be an object, got {params!r}")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise CheckpointError(
            f"{source}: rope type {rope_type!r} is not supported (only 'default')"
        )
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not 1 <= theta <= 1e12:
        raise CheckpointError(f"{source}: rope_theta must be a number between 1 and 1e12, got {theta!r}")
    return float(theta)


def _declared_dtype(raw: dict) -> str:
    name = raw.get("dtype") or raw.get("torch_dtype") or "float32"
    return name if name in _DTYPE_NAMES else "float32"


def _sliding_window(raw: dict, is_qwen2: bool) -> int | None:
    if is_qwen2 and not raw.get("use_sliding_window", False):
        return None
    return _int_field(raw, "sliding_window", "config.json") if raw.get("sliding_window") else None
