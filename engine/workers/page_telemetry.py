"""PageTelemetry: a worker's page metadata as keyframes and deltas for the `pages` topic.

A keyframe carries all five arrays; a delta carries the changed page indices and their
new values. Sequence numbers run per pool, so a subscriber that misses one asks for a
keyframe. Nothing is computed while nobody subscribes.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from engine.kv.page_pool import PagePool
from engine.wire.protocol import page_arrays

DELTA_PERIOD_S = 0.1  # at most 10 Hz
KEYFRAME_PERIOD_S = 5.0


class PageTelemetry:
    def __init__(self, pool: PagePool, role: str):
        self.pool = pool
        self.role = role
        self.seq = 0
        self.enabled = False
        self._last_delta = 0.0
        self._last_keyframe = 0.0
        self._keyframe_asked = False

    def enable(self, on: bool) -> None:
        if on and not self.enabled:
            self._keyframe_asked = True  # a new watcher needs a base to apply deltas to
        self.enabled = on
        self.pool.track_dirty = on
        if not on:
            self.pool.take_dirty()

    def ask_keyframe(self) -> None:
        self._keyframe_asked = True

    def due(self, now: float | None = None) -> list[tuple[dict, dict]]:
        """(header, arrays) messages to publish now: a keyframe when asked or every few
        seconds, else a delta of what changed, at most every DELTA_PERIOD_S."""
        if not self.enabled and not self._keyframe_asked:
            return []
        now = time.monotonic() if now is None else now
        if self._keyframe_asked or now - self._last_keyframe >= KEYFRAME_PERIOD_S:
            self._keyframe_asked = False
            self._last_keyframe = self._last_delta = now
            self.pool.take_dirty()  # the keyframe covers them
            return [self._message("keyframe", page_arrays(self.pool.metadata_snapshot()))]
        if now - self._last_delta < DELTA_PERIOD_S:
            return []
        self._last_delta = now
        dirty = self.pool.take_dirty()
        if not len(dirty):
            return []
        return [self._message("delta", self.delta_arrays(dirty))]

    def delta_arrays(self, index: np.ndarray) -> dict[str, np.ndarray]:
        """The changed pages' indices and their current values, typed for the wire."""
        pool = self.pool
        idx = torch.from_numpy(index.astype(np.int64)).to(pool.device)
        subset = {
            "owner": pool.owner[index], "epoch": pool.epoch[index], "state": pool.state[index],
            "writer": pool.writer[idx].cpu().numpy(), "filled": pool.filled[idx].cpu().numpy(),
            "refs": pool.refs(index),
        }
        return {"index": index.astype(np.int32), **page_arrays(subset)}

    def _message(self, kind: str, arrays: dict) -> tuple[dict, dict]:
        self.seq += 1
        header = {
            "op": "pages", "pool": self.pool.name, "role": self.role, "kind": kind, "seq": self.seq,
            "num_pages": self.pool.num_pages, "page_size": self.pool.page_size, "time": time.time(),
        }
        return header, arrays

