"""CausalDecoder: a Llama / Qwen2 / Mistral decoder whose parameter names match HF's."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from engine.model.config import ModelConfig
from engine.model.layers import AttentionContext, DecoderLayer, RMSNorm, RotaryTable


class _Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalDecoder(nn.Module):
    """forward(tokens, positions, ctx) -> float32 logits of the rows asked for."""

    def __init__(self, cfg: ModelConfig, max_positions: int):
        super().__init__()
        self.config = cfg
        self.model = _Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = RotaryTable(cfg.head_dim, cfg.rope_theta, max_positions)
        # called at each layer boundary of every forward pass (before each layer and after
        # the last): a worker process answers its supervisor's liveness check from there, so
        # a long prefill on CPU (a 2,000-token prompt on a 135M model: 22 s) is not taken for
        # a hung worker, and, where the cores are shared, takes its share of them
        # (engine/workers/core_share.py)
        self.at_layer_boundary: Callable[[], None] | None = None

    @property
    def max_positions(self) -> int:
        return self.rotary.cos.shape[0]

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        ctx: AttentionContext,
        logit_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """tokens/positions [T] (packed sequences); logit_rows selects which of the T rows
        get logits (prefill needs only each sequence's last token)."""
        x = self.model.embed_tokens(tokens)
        cos, sin = self.rotary.lookup(positions, x.dtype)
        boundary = self.at_layer_boundary
        for layer in self.model.layers:
            if boundary is not None:
                boundary()
            x = layer(x, cos, sin, ctx)
        if boundary is not None:
            boundary()
        if logit_rows is not None:
            x = x[logit_rows]
        return self.lm_head(self.model.norm(x)).float()
