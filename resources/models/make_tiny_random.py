"""Regenerate the embedded default model: a tiny random Llama in HF directory format.

    python resources/models/make_tiny_random.py [--out DIR] [--seed N]

Deterministic: the same seed writes byte-identical files. Needs only torch, safetensors
and tokenizers (transformers is never required to build it; tests use it as an oracle).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "pagewarden-tiny-random"
SPECIAL_TOKENS = ["<s>", "</s>", "<pad>"]  # ids 256, 257, 258 after the 256 bytes

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 272,
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": True,
    "bos_token_id": 256,
    "eos_token_id": 257,
    "pad_token_id": 258,
    "dtype": "float32",
}


def bytes_to_unicode() -> dict[int, str]:
    """The byte-level BPE alphabet: every byte as one printable unicode character."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    mapping, extra = {}, 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def build_tokenizer():
    """Byte-level tokenizer: ids 0..255 are the bytes, then the special tokens; BOS prepended."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {ch: b for b, ch in bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 256)]
    )
    return tok


def random_weights(cfg: dict, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    h, i, d = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q_out = cfg["num_attention_heads"] * d
    kv_out = cfg["num_key_value_heads"] * d

    def normal(*shape, std):
        return (torch.randn(*shape, generator=gen) * std).contiguous()

    def norm_weight():
        return (1.0 + torch.randn(h, generator=gen) * 0.1).contiguous()

    weights = {"model.embed_tokens.weight": normal(cfg["vocab_size"], h, std=0.5)}
    for n in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{n}."
        weights |= {
            p + "self_attn.q_proj.weight": normal(q_out, h, std=0.1),
            p + "self_attn.k_proj.weight": normal(kv_out, h, std=0.1),
            p + "self_attn.v_proj.weight": normal(kv_out, h, std=0.1),
            p + "self_attn.o_proj.weight": normal(h, q_out, std=0.1),
            p + "mlp.gate_proj.weight": normal(i, h, std=0.1),
            p + "mlp.up_proj.weight": normal(i, h, std=0.1),
            p + "mlp.down_proj.weight": normal(h, i, std=0.1),
            p + "input_layernorm.weight": norm_weight(),
            p + "post_attention_layernorm.weight": norm_weight(),
        }
    weights["model.norm.weight"] = norm_weight()
    return weights


def write_model(out: Path, seed: int, config: dict | None = None) -> None:
    """Write a random checkpoint; `config` overrides fields of CONFIG (benches use tiny ones)."""
    config = {**CONFIG, **(config or {})}
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(random_weights(config, seed), str(out / "model.safetensors"), metadata={"format": "pt"})
    write_tokenizer_files(out, config["max_position_embeddings"])


def write_tokenizer_files(out: Path, max_positions: int) -> None:
    """generation_config.json, tokenizer.json and tokenizer_config.json of a byte-level checkpoint."""
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 256, "eos_token_id": 257, "pad_token_id": 258}, indent=2) + "\n"
    )
    build_tokenizer().save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "pad_token": "<pad>",
                "model_max_length": max_positions,
            },
            indent=2,
        )
        + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    parser.add_argument("--seed", type=int, default=20260, help="weight seed (default 20260)")
    args = parser.parse_args()
    write_model(args.out, args.seed)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
