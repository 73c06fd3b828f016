"""Overwrite whole pages of a pool (invariant I5: freed pages are scrubbed before reuse)."""

from __future__ import annotations

import torch


def validate_scrub_inputs(data: torch.Tensor, pages: torch.Tensor) -> None:
    """Checks shared by both backends. Raises ValueError naming what is wrong."""
    if not data.is_contiguous():
        raise ValueError("scrub_pages needs the contiguous page-major pool tensor")
    if pages.dim() != 1:
        raise ValueError(f"pages must be one-dimensional, got shape {tuple(pages.shape)}")


def scrub_pages(data: torch.Tensor, pages: torch.Tensor, value: float) -> None:
    """Fill every element of data[pages] with value (0.0 for `zero`, NaN for `poison`).

    data is the page-major pool tensor [num_pages, ...]. Raises ValueError when data is
    not contiguous or pages is not one-dimensional.
    """
    validate_scrub_inputs(data, pages)
    data.index_fill_(0, pages.to(torch.int64), value)
