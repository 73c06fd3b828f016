"""A random-weight Llama of SmolLM-135M's shape, for benches that need a real model's cost:

    python bench/make_random_llama.py [--out DIR] [--seed N] [--force] [--set KEY=INT ...]

writes build/models/random-llama-135m/ (git-ignored): hidden 576, 30 layers, 9 attention
heads over 3 KV heads (head_dim 64), intermediate 1536, vocabulary 49,152, float32
safetensors, config.json (LlamaForCausalLM), generation_config.json, and a tokenizer both
vLLM and our engine load (tokenizer.json + tokenizer_config.json).

Untied embeddings: SmolLM-135M ties lm_head to embed_tokens, but a random model with tied
embeddings mostly predicts the token it just read (the residual stream carries that token's
own embedding), so greedy output degenerates into one token repeated. Untied, the work per
token is the same (one 576 x 49,152 product for the logits); only the file is bigger
(~163 M parameters, ~650 MB).

The tokenizer is a WordLevel model over synthetic words ("bakelo", "dimuta", ...), one per
id, with SentencePiece-style "▁" word markers (Metaspace), so decoded text is words
separated by spaces; ids 0..2 are <unk>, <s> (BOS), </s> (EOS).

Init: embeddings N(0, 1), every projection N(0, 1/fan_in), the output projections (o_proj,
down_proj) further scaled by 1/sqrt(2 * layers) so the residual stream stays about unit size
through 30 layers, RMSNorm weights 1. Greedy continuations of random prompts then wander
over many tokens instead of repeating one (`--check` prints a few; our engine's torch
decoder on CPU).

Deterministic: the same seed and shape write the same tensors. Idempotent: a directory that
already holds this seed's checkpoint (build_meta.json) is left alone unless --force.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "build" / "models" / "random-llama-135m"
DEFAULT_SEED = 135

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "dtype": "float32",
}
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2
SPECIAL_IDS = (0, 1, 2)
MARK = "\u2581"  # SentencePiece's word marker
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
SYLLABLES = [c + v for c in _CONSONANTS for v in _VOWELS]  # 70
FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
         "tokenizer_config.json", "build_meta.json")


def word(n: int) -> str:
    """The n-th synthetic word: n in base 70, three syllables (70**3 = 343,000 distinct)."""
    if not 0 <= n < len(SYLLABLES) ** 3:
        raise ValueError(f"no synthetic word for {n}")
    parts = []
    for _ in range(3):
        n, r = divmod(n, len(SYLLABLES))
        parts.append(SYLLABLES[r])
    return "".join(reversed(parts))


def vocabulary(size: int) -> dict[str, int]:
    """token -> id: the special tokens, then one "▁word" per remaining id (all distinct)."""
    if size <= len(SPECIAL_TOKENS):
        raise ValueError(f"a vocabulary of {size} leaves no room for words")
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for i in range(len(SPECIAL_TOKENS), size):
        vocab[MARK + word(i)] = i
    return vocab


def build_tokenizer(size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    tok = Tokenizer(models.WordLevel(vocab=vocabulary(size), unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=MARK, prepend_scheme="always", split=True)
    tok.decoder = decoders.Metaspace(replacement=MARK, prepend_scheme="always", split=True)
    tok.add_special_tokens(SPECIAL_TOKENS)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    return tok


def random_weights(cfg: dict, seed: int) -> dict:
    import torch

    gen = torch.Generator().manual_seed(seed)
    h, i, d = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    layers = cfg["num_hidden_layers"]
    q_out, kv_out = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    out_scale = 1.0 / math.sqrt(2 * layers)

    def normal(rows: int, cols: int, scale: float = 1.0):
        """(rows, cols) with std scale / sqrt(cols): unit-size outputs for unit-size inputs."""
        return (torch.randn(rows, cols, generator=gen) * (scale / math.sqrt(cols))).contiguous()

    weights = {"model.embed_tokens.weight": torch.randn(cfg["vocab_size"], h, generator=gen).contiguous()}
    for n in range(layers):
        p = f"model.layers.{n}."
        weights |= {
            p + "self_attn.q_proj.weight": normal(q_out, h),
            p + "self_attn.k_proj.weight": normal(kv_out, h),
            p + "self_attn.v_proj.weight": normal(kv_out, h),
            p + "self_attn.o_proj.weight": normal(h, q_out, out_scale),
            p + "mlp.gate_proj.weight": normal(i, h),
            p + "mlp.up_proj.weight": normal(i, h),
            p + "mlp.down_proj.weight": normal(h, i, out_scale),
            p + "input_layernorm.weight": torch.ones(h),
            p + "post_attention_layernorm.weight": torch.ones(h),
        }
    weights["model.norm.weight"] = torch.ones(h)
    if not cfg["tie_word_embeddings"]:
        weights["lm_head.weight"] = normal(cfg["vocab_size"], h)
    return weights


def build_meta(config: dict, seed: int) -> dict:
    return {"generator": "bench/make_random_llama.py", "seed": seed, "config": config}


def is_built(out: Path, config: dict, seed: int) -> bool:
    """Every file there, written by this script for this seed and config."""
    if not all((out / name).is_file() for name in FILES):
        return False
    try:
        return json.loads((out / "build_meta.json").read_text()) == build_meta(config, seed)
    except (OSError, json.JSONDecodeError):
        return False


def write_checkpoint(out: Path = DEFAULT_OUT, *, seed: int = DEFAULT_SEED, overrides: dict | None = None,
                     force: bool = False) -> bool:
    """Write the checkpoint (`overrides` replace CONFIG fields: tests build tiny ones). Returns
    False when it was there already (and not forced)."""
    from safetensors.torch import save_file

    config = {**CONFIG, **(overrides or {})}
    out = Path(out)
    if not force and is_built(out, config, seed):
        return False
    out.mkdir(parents=True, exist_ok=True)
    (out / "build_meta.json").unlink(missing_ok=True)  # written last: a half-written dir is never "built"
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}, indent=2) + "\n")
    build_tokenizer(config["vocab_size"]).save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>", "bos_token": "<s>",
        "eos_token": "</s>", "model_max_length": config["max_position_embeddings"],
        "clean_up_tokenization_spaces": False}, indent=2) + "\n")
    save_file(random_weights(config, seed), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "build_meta.json").write_text(json.dumps(build_meta(config, seed), indent=2) + "\n")
    return True


def shape_overrides(pairs: list[str]) -> dict[str, int]:
    """["hidden_size=192", ...] -> {"hidden_size": 192, ...}: integer fields of CONFIG only."""
    ints = [k for k, v in CONFIG.items() if type(v) is int]  # not the booleans
    out = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        if key not in ints:
            raise ValueError(f"--set {pair!r}: {key!r} is not an integer field of the config ({', '.join(ints)})")
        try:
            out[key] = int(value)
        except ValueError:
            raise ValueError(f"--set {pair!r}: {value!r} is not an integer") from None
        if out[key] < 1:
            raise ValueError(f"--set {pair!r}: must be at least 1")
    return out


def greedy_check(out: Path, prompts: int = 3, prompt_len: int = 16, new: int = 32) -> list[list[int]]:
    """Greedy continuations of seeded random prompts through our engine's unpaged dense
    reference (CPU): what `--check` prints."""
    import torch

    sys.path.insert(0, str(REPO))
    from engine.dense_reference import dense_greedy
    from engine.model.load import load_model

    model = load_model(out, device="cpu")
    gen = torch.Generator().manual_seed(0)
    low = max(SPECIAL_IDS) + 1
    outs = []
    with torch.no_grad():
        for _ in range(prompts):
            ids = torch.randint(low, model.config.vocab_size, (prompt_len,), generator=gen).tolist()
            outs.append(dense_greedy(model.decoder, ids, new)[0])
    return outs


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--seed", type=int, default=DEFAULT_SEED)
    p.add_argument("--force", action="store_true", help="rewrite even when it is there already")
    p.add_argument("--check", action="store_true", help="print greedy continuations of 3 random prompts")
    p.add_argument("--set", nargs="+", default=[], metavar="KEY=INT",
                   help="another shape: integer config fields, e.g. hidden_size=192 num_hidden_layers=8")
    args = p.parse_args()
    try:
        overrides = shape_overrides(args.set)
    except ValueError as exc:
        p.error(str(exc))
    wrote = write_checkpoint(args.out, seed=args.seed, overrides=overrides, force=args.force)
    print(f"{'wrote' if wrote else 'already there (use --force to rewrite)'}: {args.out}")
    if args.check:
        for ids in greedy_check(args.out):
            print(f"{len(set(ids))} distinct of {len(ids)}: {ids}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
