"""Choose the next token of each request from its float32 logits."""

from __future__ import annotations

import torch

from engine.errors import SamplingFailed
from engine.request import Request


def sample_next(logits: torch.Tensor, requests: list[Request],
                generators: dict[str, torch.Generator]) -> list[int | SamplingFailed]:
    """Greedy rows in one argmax; sampled rows each with the request's own generator.

    logits [B, V] float32, one row per request in order. A row whose token cannot be drawn
    gives a SamplingFailed naming its request instead of a token: the caller fails that
    request alone, and the others in the batch go on.
    """
    tokens = torch.argmax(logits, dim=-1).tolist()
    for row, req in enumerate(requests):
        p = req.params
        if not p.greedy:  # a tiny temperature is greedy: dividing by it overflows
            gen = generators.get(req.request_id)
            if gen is None:
                gen = torch.Generator(device=logits.device)
                gen.manual_seed(p.seed if p.seed is not None else torch.seed())
                generators[req.request_id] = gen
            try:
                tokens[row] = _sample_row(logits[row], p.temperature, p.top_k, p.top_p, gen)
            except (RuntimeError, ValueError) as exc:  # e.g. multinomial over inf/NaN probabilities
                tokens[row] = SamplingFailed(
                    f"request {req.request_id}: no next token could be sampled at temperature {p.temperature:g}, "
                    f"top_k {p.top_k}, top_p {p.top_p:g} ({type(exc).__name__}: {str(exc).splitlines()[0]})")
    return tokens


def _sample_row(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, gen) -> int:
    scaled = logits / temperature
    if 0 < top_k < scaled.shape[-1]:
        cutoff = torch.topk(scaled, top_k).values[-1]
        scaled = scaled.masked_fill(scaled < cutoff, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < top_p
        sorted_probs = sorted_probs * keep
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=gen).item())
