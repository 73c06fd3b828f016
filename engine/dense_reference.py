"""Unpaged dense reference: greedy generation by full causal recompute, no KV cache.

Slow on purpose and obviously right; the paged engine must produce the same tokens and
(nearly) the same logits.
"""

from __future__ import annotations

import torch

from engine.attention import DenseCausalAttention
from engine.model.decoder import CausalDecoder


def dense_greedy(
    decoder: CausalDecoder, prompt_ids: list[int], max_new_tokens: int
) -> tuple[list[int], list[torch.Tensor]]:
    """Returns the generated ids and the float32 logits that chose each of them."""
    device = decoder.model.embed_tokens.weight.device
    ids = list(prompt_ids)
    generated, logits_seen = [], []
    for _ in range(max_new_tokens):
        tokens = torch.tensor(ids, dtype=torch.long, device=device)
        positions = torch.arange(len(ids), device=device)
        last = torch.tensor([len(ids) - 1], device=device)
        logits = decoder(tokens, positions, DenseCausalAttention([len(ids)]), logit_rows=last)[0]
        tok = int(torch.argmax(logits))
        generated.append(tok)
        logits_seen.append(logits)
        ids.append(tok)
    return generated, logits_seen
