"""Paged decode attention on the CPU: the step's I1 plan and each layer's attention, in C++.

- plan_decode (csrc/decode_plan_cpu.cpp): the reference's rule (kernels.paged_attention_ref
  .plan_decode, the oracle the tests hold it to) in one pass instead of ~20 torch ops.
- attend_planned (csrc/attention_cpu.cpp): the reference copies every page a step
  reads into a private buffer before SDPA, in every layer; this reads each readable token
  where it lies and never touches a blocked one.

Either falls back to the reference where the C++ module is not built or the tensors are
not float32 on the CPU.
"""

from __future__ import annotations

import torch

from kernels import cpu_extension, paged_attention_ref

_NO_KEYS = torch.empty(0, dtype=torch.int64)


def plan_decode(block_table, expected_tags, seq_lens, token_writer, page_size: int,
                check_tags: bool = True, mask_foreign: bool = True, *,
                page_keys=None, expected_keys=None) -> paged_attention_ref.DecodePlan:
    """paged_attention_ref.plan_decode's plan, computed in C++ on the CPU.

    Raises ValueError when a seq_len needs more pages than block_table holds, RuntimeError
    naming a row whose table points outside the pool.
    """
    ext = cpu_extension.extension()
    if ext is None or any(t.device.type != "cpu" for t in (block_table, expected_tags, seq_lens, token_writer)):
        return paged_attention_ref.plan_decode(block_table, expected_tags, seq_lens, token_writer, page_size,
                                               check_tags, mask_foreign, page_keys=page_keys,
                                               expected_keys=expected_keys)
    if token_writer.dim() != 2 or token_writer.shape[1] != page_size:
        raise ValueError(f"token_writer must be [num_pages, page_size={page_size}], got {tuple(token_writer.shape)}")
    num_pages_seq = paged_attention_ref.pages_needed(block_table, seq_lens, page_size)
    paged_attention_ref._check_keys(page_keys, expected_keys, token_writer.shape[0], block_table.shape)
    if page_keys is None:  # no page is keyed: empty tensors tell the kernel to skip the key check
        page_keys = expected_keys = _NO_KEYS
    pages, blocked, violations, foreign, empty = ext.plan_tags(
        block_table, expected_tags, seq_lens, token_writer, num_pages_seq, check_tags, mask_foreign,
        page_keys, expected_keys)
    return paged_attention_ref.DecodePlan(pages, blocked[:, :, None, None], violations,
                                          empty if bool(empty.any()) else None, foreign if check_tags else None)


def usable(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor | None = None,
           out: torch.Tensor | None = None) -> bool:
    """Whether this step can run in the kernel: float32 on the CPU (out too, when given), K
    and V laid out alike with head_dim at unit stride, and the kernel built."""
    v_cache = k_cache if v_cache is None else v_cache
    tensors = (q, k_cache, v_cache) if out is None else (q, k_cache, v_cache, out)
    return (k_cache.dim() == 4 and k_cache.stride(3) == 1 and v_cache.shape == k_cache.shape
            and v_cache.stride() == k_cache.stride() and cpu_extension.usable(*tensors))


def attend_planned(q, k_cache, v_cache, plan, *, scale: float, out: torch.Tensor | None = None,
                   vectorized: bool = True) -> torch.Tensor:
    """One layer's decode attention through plan (kernels.paged_attention_ref.DecodePlan).

    In the kernel where usable(), else through the reference; either way it reads only the
    slots the plan leaves unblocked and a row with none is zero. vectorized=False forces the
    kernel's plain loops. Raises RuntimeError (from the kernel) naming a shape, dtype or page
    that does not fit.
    """
    if not usable(q, k_cache, v_cache, out):
        return paged_attention_ref.attend_planned(q, k_cache, v_cache, plan, scale=scale, out=out)
    target = out if out is not None and out.is_contiguous() else torch.empty(q.shape, dtype=q.dtype)
    batch = q.shape[0]
    # the kernel answers how many rows ran on each path; tests check it, the step needs only out
    cpu_extension.extension().paged_decode(q.contiguous(), k_cache, v_cache, plan.pages,
                                           plan.blocked.view(batch, -1), float(scale), target, vectorized)
    if out is None:
        return target
    if target is not out:
        out.copy_(target)
    return out
