"""Write new K/V tokens into their pages and stamp each page's writer tag, in plain torch."""

from __future__ import annotations

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


def store_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    slot_mapping: torch.Tensor,
    writer_tags: torch.Tensor,
    writer: torch.Tensor,
    filled: torch.Tensor,
) -> None:
    """Store token t's K/V at slot_mapping[t] = page * page_size + offset (negative: skip it).

    Sets writer[page] = writer_tags[t] and filled[page] = max(filled[page], offset + 1).
    Raises ValueError on inconsistent shapes.
    """
    validate_store_inputs(k_cache, v_cache, k_new, v_new, slot_mapping, writer_tags)
    page_size = k_cache.shape[1]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    pages, offsets = slots // page_size, slots % page_size
    # index_put_ on the strided per-layer views writes through to the pool tensor
    k_cache[pages, offsets] = k_new[keep].to(k_cache.dtype)
    v_cache[pages, offsets] = v_new[keep].to(v_cache.dtype)
    writer[pages] = writer_tags[keep]
    filled.scatter_reduce_(0, pages, (offsets + 1).to(filled.dtype), reduce="amax")
