"""The building blocks of a Llama-family decoder, in plain torch, on packed tokens.

Tokens of every sequence in a batch are packed along dim 0 ([T, hidden]); attention is
delegated to an AttentionContext (engine/attention.py) so that the model itself knows
nothing about pages, pools or ownership.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn
from torch.nn import functional as F

from engine.model.config import ModelConfig
from kernels import cpu_extension


class AttentionContext(Protocol):
    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """q [T, H, D], k/v [T, KVH, D] (RoPE applied) -> attention output [T, H, D]."""


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if cpu_extension.usable(x, self.weight):  # one pass in C++ (kernels/csrc/norm_rope_cpu.cpp)
            return cpu_extension.extension().rms_norm(x, self.weight, self.eps)
        if x.dtype == torch.float32:
            # the fused op: bit-identical to the spelled-out formula in float32, and faster
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        # Normalise in float32 whatever the model dtype, as the reference implementation does.
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


class RotaryTable(nn.Module):
    """cos/sin for every position up to `max_positions`, computed once in float32."""

    def __init__(self, head_dim: int, theta: float, max_positions: int):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        positions = torch.arange(max_positions, dtype=torch.float)
        freqs = positions[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def lookup(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos[positions].to(dtype), self.sin[positions].to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, may_overwrite: bool = False) -> torch.Tensor:
    """x [T, heads, D]; cos/sin [T, D]. With may_overwrite (x is a fresh projection output that
    nothing else reads) the C++ kernel, where it applies, rotates x in place and returns it."""
    if may_overwrite and x.stride(2) == 1 and cpu_extension.usable(x, cos, sin):
        cpu_extension.extension().rope_(x, cos, sin)
        return x
    cos, sin = cos[:, None, :], sin[:, None, :]
    return (x * cos) + (_rotate_half(x) * sin)


class Attention(nn.Module):
    """q, k and v come from one fused projection (the loader stacks HF's q/k/v_proj)."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size, self.kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=cfg.o_bias)

    def forward(self, x, cos, sin, ctx: AttentionContext) -> torch.Tensor:
        t = x.shape[0]
        qkv = self.qkv_proj(x)
        # RoPE on q and k together: one pass over [T, H + KVH, D]
        qk = apply_rope(qkv[:, : self.q_size + self.kv_size].view(t, -1, self.head_dim), cos, sin,
                        may_overwrite=True)
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        v = qkv[:, self.q_size + self.kv_size :].view(t, self.num_kv_heads, self.head_dim)
        out = ctx.attend(self.layer, q, k, v)
        return self.o_proj(out.reshape(t, self.q_size))


class MLP(nn.Module):
    """SwiGLU with gate and up fused into one projection (the loader stacks them)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.intermediate = cfg.intermediate_size
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        return self.down_proj(F.silu(gate_up[:, : self.intermediate]) * gate_up[:, self.intermediate :])


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.self_attn = Attention(cfg, layer)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, ctx: AttentionContext) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, ctx)
        return x + self.mlp(self.post_attention_layernorm(x))
