"""Overwrite whole pages of a pool in Triton (invariant I5), one program per page and block."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.scrub_ref import validate_scrub_inputs

_BLOCK = 1024
_MAX_BLOCKS_PER_PAGE = 256
# pinned: Triton 3.9 warns when it is left to the default (and the default is about to change)
_FP_FUSION = True


@triton.jit
def _scrub_pages_kernel(data_ptr, pages_ptr, value, page_numel, BLOCK: tl.constexpr):
    page = tl.load(pages_ptr + tl.program_id(0))
    # int64 page offset: a pool of tens of GiB overflows int32 element offsets
    base = data_ptr + page.to(tl.int64) * page_numel
    fill = (tl.full([BLOCK], 0.0, tl.float32) + value).to(data_ptr.dtype.element_ty)
    for start in range(tl.program_id(1) * BLOCK, page_numel, tl.num_programs(1) * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        tl.store(base + offs, fill, mask=offs < page_numel)


def scrub_pages(data: torch.Tensor, pages: torch.Tensor, value: float) -> None:
    """Fill every element of data[pages] with value (0.0 for `zero`, NaN for `poison`).

    data is the page-major pool tensor [num_pages, ...]. Raises ValueError when data is
    not contiguous or pages is not one-dimensional.
    """
    validate_scrub_inputs(data, pages)
    if pages.numel() == 0:
        return
    page_numel = data[0].numel()
    # the second grid axis is capped (CUDA allows 65535); programs stride over the page
    grid = (pages.numel(), min(triton.cdiv(page_numel, _BLOCK), _MAX_BLOCKS_PER_PAGE))
    _scrub_pages_kernel[grid](data, pages, float(value), page_numel, BLOCK=_BLOCK,
                              enable_fp_fusion=_FP_FUSION)
