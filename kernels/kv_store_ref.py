"""Write new K/V tokens into their pages and stamp each token slot's writer tag, in plain torch."""

from __future__ import annotations

from dataclasses import dataclass

import torch


def validate_store_inputs(k_cache, v_cache, k_new, v_new, slot_mapping, writer_tags) -> None:
    """Check shapes shared by both backends. Raises ValueError naming the mismatch."""
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            "k_cache and v_cache must both be [num_pages, page_size, kv_heads, head_dim], "
            f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    if k_new.dim() != 3 or k_new.shape != v_new.shape or k_new.shape[1:] != k_cache.shape[2:]:
        raise ValueError(
            f"k_new and v_new must both be [tokens, {k_cache.shape[2]}, {k_cache.shape[3]}], "
            f"got {tuple(k_new.shape)} and {tuple(v_new.shape)}"
        )
    tokens = k_new.shape[0]
    if slot_mapping.shape != (tokens,) or writer_tags.shape != (tokens,):
        raise ValueError(
            f"slot_mapping and writer_tags must be [{tokens}], "
            f"got {tuple(slot_mapping.shape)} and {tuple(writer_tags.shape)}"
        )


@dataclass
class StorePlan:
    """Where one step's new tokens go, resolved once for all layers."""

    keep: torch.Tensor | None  # [T] bool, None when every token is stored
    pages: torch.Tensor  # [kept] int64
    offsets: torch.Tensor  # [kept] int64


def plan_store(slot_mapping: torch.Tensor, page_size: int) -> StorePlan:
    keep = slot_mapping >= 0
    if bool(keep.all()):
        slots, keep = slot_mapping.to(torch.int64), None
    else:
        slots = slot_mapping[keep].to(torch.int64)
    return StorePlan(keep, slots // page_size, slots % page_size)


def store_planned(k_cache, v_cache, k_new, v_new, plan: StorePlan, writer_tags=None,
                  writer=None, filled=None, token_writer=None) -> None:
    """Write K/V through a plan; with writer_tags, also stamp token_writer, writer and filled."""
    if plan.keep is not None:
        k_new, v_new = k_new[plan.keep], v_new[plan.keep]
    # index_put_ on the strided per-layer views writes through to the pool tensor
    k_cache[plan.pages, plan.offsets] = k_new.to(k_cache.dtype)
    v_cache[plan.pages, plan.offsets] = v_new.to(v_cache.dtype)
    if writer_tags is not None:
        tags = writer_tags if plan.keep is None else writer_tags[plan.keep]
        # I1 reads this one: who wrote each token slot
        token_writer[plan.pages, plan.offsets] = tags
        writer[plan.pages] = tags  # the page's last writer, for telemetry and forensics
        # filled counts the token slots written this epoch (each is written once): a gap
        # leaves it short of what a reader needs, so I1 sees the gap
        filled.index_add_(0, plan.pages, torch.ones_like(plan.pages, dtype=filled.dtype))


def store_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    slot_mapping: torch.Tensor,
    writer_tags: torch.Tensor,
    writer: torch.Tensor,
    filled: torch.Tensor,
    token_writer: torch.Tensor,
    stamp: bool = True,
) -> None:
    """Store token t's K/V at slot_mapping[t] = page * page_size + offset (negative: skip it).

    With stamp (once per forward pass, not per layer): token_writer[page, offset] =
    writer[page] = writer_tags[t] and filled[page] += 1 for every token written into it.
    Raises ValueError on inconsistent shapes.
    """
    validate_store_inputs(k_cache, v_cache, k_new, v_new, slot_mapping, writer_tags)
    plan = plan_store(slot_mapping, k_cache.shape[1])
    store_planned(k_cache, v_cache, k_new, v_new, plan, writer_tags if stamp else None, writer, filled,
                  token_writer)
