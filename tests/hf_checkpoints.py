"""Random checkpoints of every accepted architecture, saved by HF transformers.

transformers is the correctness oracle only: it writes the checkpoints our loader must
read and generates the tokens our engine must reproduce.
"""

from __future__ import annotations

from pathlib import Path

import torch

COMMON = dict(
    vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    max_position_embeddings=512, rms_norm_eps=1e-6,
)

ARCH_CASES: dict[str, dict] = {
    "llama-gqa": dict(arch="llama", num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False),
    "llama-mha-tied": dict(arch="llama", num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True),
    "llama-bias": dict(arch="llama", num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                       attention_bias=True, mlp_bias=True, rope_theta=500000.0),
    "qwen2-gqa": dict(arch="qwen2", num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
    "qwen2-mha": dict(arch="qwen2", num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False),
    "mistral-mqa": dict(arch="mistral", num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=False,
                        sliding_window=None, head_dim=32),
}


def _hf_classes(arch: str):
    import transformers as tf

    return {
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
        "mistral": (tf.MistralConfig, tf.MistralForCausalLM),
    }[arch]


def write_random_checkpoint(out: Path, *, arch: str, seed: int = 7, max_shard_size=None,
                            rope_theta: float = 10000.0, **overrides) -> Path:
    """Build a random model with transformers and save it in HF format to `out`.

    Weights use a wider init than HF's 0.02 so logits are spread: near-ties would make
    greedy comparisons depend on float rounding rather than on correctness.
    """
    config_cls, model_cls = _hf_classes(arch)
    config = config_cls(**{**COMMON, **overrides}, initializer_range=0.15,
                        rope_parameters={"rope_type": "default", "rope_theta": rope_theta})
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(torch.randn_like(param) * 0.1)  # exercise the loaded norm weights
            elif name.endswith(".bias"):
                param.normal_(0.0, 0.1)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out, **kwargs)
    return out


def hf_greedy(model_dir: Path, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """HF generate(), one prompt at a time, greedy, never stopping early."""
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    outs = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                 min_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0)
        outs.append(out[0, len(prompt):].tolist())
    return outs
