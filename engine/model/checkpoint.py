"""Read a local HF checkpoint directory into a CausalDecoder. Never downloads anything."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from engine.errors import CheckpointError
from engine.model.config import ModelConfig
from engine.model.decoder import CausalDecoder
from engine.model.precheck import INDEX_FILE, SINGLE_FILE  # the file names, declared once (torch-free)

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor name the decoder needs, with its shape."""
    h, d, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q_out, kv_out = cfg.num_heads * d, cfg.num_kv_heads * d
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (cfg.vocab_size, h),
        "model.norm.weight": (h,),
    }
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    for n in range(cfg.num_layers):
        p = f"model.layers.{n}."
        shapes |= {
            p + "self_attn.q_proj.weight": (q_out, h),
            p + "self_attn.k_proj.weight": (kv_out, h),
            p + "self_attn.v_proj.weight": (kv_out, h),
            p + "self_attn.o_proj.weight": (h, q_out),
            p + "mlp.gate_proj.weight": (i, h),
            p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
        }
        if cfg.qkv_bias:
            shapes |= {
                p + "self_attn.q_proj.bias": (q_out,),
                p + "self_attn.k_proj.bias": (kv_out,),
                p + "self_attn.v_proj.bias": (kv_out,),
            }
        if cfg.o_bias:
            shapes[p + "self_attn.o_proj.bias"] = (h,)
        if cfg.mlp_bias:
            shapes |= {
                p + "mlp.gate_proj.bias": (i,),
                p + "mlp.up_proj.bias": (i,),
                p + "mlp.down_proj.bias": (h,),
            }
    return shapes


def weight_files(model_dir: Path) -> dict[str, Path]:
    """tensor name -> file holding it, from the shard index or the single file."""
    index = model_dir / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index}: not a valid shard index ({exc})") from None
        files = {name: model_dir / shard for name, shard in weight_map.items()}
        for shard in sorted(set(files.values())):
            if not shard.is_file():
                raise CheckpointError(f"missing file: {shard} (listed in {index.name})")
        return files
    single = model_dir / SINGLE_FILE
    if not single.is_file():
        raise CheckpointError(f"missing file: {single} (and no {INDEX_FILE})")
    try:
        with safe_open(single, framework="pt") as f:
            return {name: single for name in f.keys()}
    except Exception as exc:
        raise CheckpointError(f"{single}: cannot read safetensors ({exc})") from None


# checkpoint names stacked, in this order, into one fused parameter of ours
_STACKED = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}


def stack_projections(tensors: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """HF's per-projection tensors -> our fused qkv_proj / gate_up_proj parameters."""
    out = dict(tensors)
    for n in range(cfg.num_layers):
        prefix = f"model.layers.{n}."
        for fused, parts in _STACKED.items():
            for kind in ("weight", "bias"):
                names = [f"{prefix}{part}.{kind}" for part in parts]
                if names[0] in out:
                    out[f"{prefix}{fused}.{kind}"] = torch.cat([out.pop(name) for name in names])
    if cfg.tie_word_embeddings:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


def load_decoder(
    model_dir: Path, cfg: ModelConfig, *, dtype: torch.dtype, device: torch.device, max_positions: int
) -> CausalDecoder:
    """Build the decoder and fill it from safetensors. Raises CheckpointError naming the
    tensor and file for anything missing or misshapen."""
    shapes = expected_shapes(cfg)
    files = weight_files(model_dir)
    missing = [name for name in shapes if name not in files]
    if missing:
        raise CheckpointError(
            f"{model_dir}: {len(missing)} tensor(s) missing from the checkpoint, first: {missing[0]}"
        )
    tensors: dict[str, torch.Tensor] = {}
    by_file: dict[Path, list[str]] = {}
    for name in shapes:
        by_file.setdefault(files[name], []).append(name)
    for path, names in by_file.items():
        try:
            with safe_open(path, framework="pt", device="cpu") as f:
                for name in names:
                    t = f.get_tensor(name)
                    if tuple(t.shape) != shapes[name]:
                        raise CheckpointError(
                            f"{path.name}: tensor {name} has shape {tuple(t.shape)}, "
                            f"expected {shapes[name]}"
                        )
                    tensors[name] = t.to(device=device, dtype=dtype)
        except CheckpointError:
            raise
        except Exception as exc:  # safetensors' own error type is not importable by a stable name
            raise CheckpointError(f"{path}: cannot read safetensors ({exc})") from None
    with torch.device("meta"):
        decoder = CausalDecoder(cfg, max_positions)
    decoder.load_state_dict(stack_projections(tensors, cfg), strict=True, assign=True)
    if cfg.tie_word_embeddings:
        decoder.lm_head.weight = decoder.model.embed_tokens.weight
    # The RoPE table was built on meta; rebuild it for real on the target device.
    decoder.rotary = type(decoder.rotary)(cfg.head_dim, cfg.rope_theta, max_positions).to(device)
    return decoder.eval()
