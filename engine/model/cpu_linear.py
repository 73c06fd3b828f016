"""Linear layers in oneDNN's packed weight layout, for float32 decoding on CPU.

Decoding on a CPU streams every weight from memory once per step. With the weights in
the layout oneDNN packs them into ahead of time, a step of SmolLM-135M's shape took 0.90x
the time of `F.linear` at 16 concurrent requests and 0.92x at one on a quiet machine
(0.72x at 16 with the other core busy; bench/RESULTS.md).
oneDNN costs about 20 µs more per call, so a weight small enough to stay in cache (the
default copy model's are all under 1 MiB) is faster left plain: only weights of at least
PACK_MIN_BYTES are packed.

Results differ from `F.linear` by float32 rounding (the sums run in another order): up to
about 1e-4 on unit-size activations.
"""

from __future__ import annotations

import torch
from torch import nn

PACK_MIN_BYTES = 1 << 20  # larger than a core's L2: streamed from memory every step


def packing_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


class PackedLinear(nn.Module):
    """y = x W^T + b with W held only in oneDNN's packed layout (not a Parameter: it is
    not in state_dict and does not move with .to())."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        with torch.no_grad():
            self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach().contiguous(), None)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def pack_linears(module: nn.Module, min_bytes: int = PACK_MIN_BYTES) -> int:
    """Replace, in place, every float32 CPU nn.Linear under `module` whose weight has at
    least min_bytes by a PackedLinear. Returns how many were replaced. A tied weight (the
    lm_head sharing the embedding) gets its own packed copy; the embedding keeps the
    original."""
    if not packing_available():
        return 0
    count = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            weight = getattr(child, "weight", None)
            if (type(child) is nn.Linear and weight.device.type == "cpu" and weight.dtype == torch.float32
                    and weight.numel() * weight.element_size() >= min_bytes):
                setattr(parent, name, PackedLinear(child))
                count += 1
    return count


def projection_weights(module: nn.Module) -> int:
    """How many projection weights there are under `module`, plain or packed: what a decode
    step multiplies by (a tied lm_head counts: it is a product of its own every step)."""
    total = 0
    for child in module.modules():
        if type(child) is nn.Linear:
            total += child.weight.numel()
        elif isinstance(child, PackedLinear):
            total += child.in_features * child.out_features
    return total
