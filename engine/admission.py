"""I2 admission: reject a request that cannot fit, before any page is allocated anywhere.

A request occupies prompt + max_new_tokens tokens. It must fit the context window, the
prefill pool (which holds the prompt) and the decode pool (which holds everything).
It is never truncated and never replaced by a placeholder.
"""

from __future__ import annotations

import numbers

from engine.errors import AdmissionRejected, InvalidRequest


def pool_needs(prompt_len: int, max_new_tokens: int) -> dict[str, int]:
    """Tokens each pool must hold for one request."""
    return {"prefill": prompt_len, "decode": prompt_len + max_new_tokens}


def check_admission(
    request_id: str,
    prompt_len: int,
    max_new_tokens: int,
    *,
    context_window: int,
    pool_capacity_tokens: dict[str, int],
) -> None:
    """Raises AdmissionRejected naming the request size and the limit it exceeds."""
    total = prompt_len + max_new_tokens
    size = f"{total:,} tokens (prompt {prompt_len:,} + max_new_tokens {max_new_tokens:,})"
    if total > context_window:
        raise AdmissionRejected(
            f"request {request_id} rejected before allocation: it needs {size} "
            f"but the context window is {context_window:,} tokens",
            needed_tokens=total, limit_tokens=context_window, limit_name="context_window",
        )
    for pool, needed in pool_needs(prompt_len, max_new_tokens).items():
        capacity = pool_capacity_tokens.get(pool)
        if capacity is not None and needed > capacity:
            raise AdmissionRejected(
                f"request {request_id} rejected before allocation: the {pool} pool must hold "
                f"{needed:,} of its {size} but holds {capacity:,} tokens in all",
                needed_tokens=needed, limit_tokens=capacity, limit_name=f"pool:{pool}",
            )


def check_prompt_ids(request_id: str, prompt_ids: list[int], vocab_size: int) -> list[int]:
    """Raises InvalidRequest for an empty prompt or a token id outside the vocabulary."""
    if not prompt_ids:
        raise InvalidRequest(f"request {request_id}: the prompt is empty (at least 1 token needed)")
    if all(type(tok) is int for tok in prompt_ids):  # what the wire decodes to: check the range at once
        if min(prompt_ids) >= 0 and max(prompt_ids) < vocab_size:
            return list(prompt_ids)
    ids = []
    for i, tok in enumerate(prompt_ids):
        if isinstance(tok, bool) or not isinstance(tok, numbers.Integral) or not 0 <= tok < vocab_size:
            raise InvalidRequest(
                f"request {request_id}: prompt token {i} = {tok!r} is outside the "
                f"vocabulary 0..{vocab_size - 1}"
            )
        ids.append(int(tok))
    return ids
