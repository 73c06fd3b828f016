"""Page states and writer tags (docs/INVARIANTS.md).

A writer tag packs (slot, epoch) into one int64 so that a kernel can compare it with
the reader's expected tag in one load. `epoch` is the page's allocation counter, so a
tag names one allocation of one page by one request and can never be reused.
"""

from __future__ import annotations

import enum
from typing import Any, overload

import numpy as np
import numpy.typing as npt

FREE_OWNER = -1
# the owner of a page the prefix cache holds: shared read-only by the requests that hold it
# (the pool's `holders`), written by none of them; its writer tag stays its original writer's
SHARED_OWNER = -2
NO_WRITER = -1
_EPOCH_MASK = 0xFFFFFFFF


class PageState(enum.IntEnum):
    FREE = 0
    RESERVED = 1  # allocated, not yet written
    IN_FLIGHT = 2  # target of a KV transfer that has not completed
    WRITTEN = 3
    QUARANTINED = 4  # read or written against ownership; scrubbed before reuse


@overload
def pack_tag(slot: int | np.integer[Any], epoch: int | np.integer[Any]) -> int: ...
@overload
def pack_tag(slot: npt.NDArray[np.integer[Any]] | int | np.integer[Any],
             epoch: npt.NDArray[np.integer[Any]]) -> npt.NDArray[np.int64]: ...
@overload
def pack_tag(slot: npt.NDArray[np.integer[Any]],
             epoch: npt.NDArray[np.integer[Any]] | int | np.integer[Any]) -> npt.NDArray[np.int64]: ...
def pack_tag(slot: npt.NDArray[np.integer[Any]] | int | np.integer[Any],
             epoch: npt.NDArray[np.integer[Any]] | int | np.integer[Any]) -> int | npt.NDArray[np.int64]:
    """(slot, epoch) -> int64 tag; works on ints and numpy arrays alike."""
    if isinstance(slot, np.ndarray) or isinstance(epoch, np.ndarray):
        return (np.asarray(slot, np.int64) << 32) | (np.asarray(epoch, np.int64) & _EPOCH_MASK)
    return (int(slot) << 32) | (int(epoch) & _EPOCH_MASK)


def unpack_tag(tag: int) -> tuple[int, int] | None:
    """int64 tag -> (slot, epoch), or None for a page never written."""
    tag = int(tag)
    if tag == NO_WRITER:
        return None
    return tag >> 32, tag & _EPOCH_MASK
