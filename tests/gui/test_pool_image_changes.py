"""PoolImage draws from the mirror's collected changes, with no copy of its own (issue 13)."""

from __future__ import annotations

import numpy as np

from engine.client import PageMirror
from gui.model.page_colors import RESERVED, WRITTEN, PageColors
from gui.model.page_grid import PoolImage
from tests.gui.test_page_colors import Pool, frame


def test_two_deltas_between_repaints_recompute_their_union_only():
    mirror, colors = PageMirror(), PageColors()
    pool, image = Pool(mirror, "p", 4096), PoolImage(colors)
    frame(colors, (image, pool))
    assert image.last_update_pages == 4096
    pool.set([8, 9], owner=1, state=WRITTEN)
    pool.set([9, 10], owner=2, state=RESERVED)  # two messages between repaints
    frame(colors, (image, pool))
    assert image.last_update_pages == 3
    assert pool.pool.take_changes().tolist() == []  # the image took them
    assert not hasattr(image, "_owner") and not hasattr(image, "_state")
    frame(colors, (image, pool))
    assert image.last_update_pages == 0


def test_a_resync_keyframe_recomputes_only_the_pages_that_differ():
    mirror, colors = PageMirror(), PageColors()
    pool, image = Pool(mirror, "p", 1024), PoolImage(colors)
    frame(colors, (image, pool))
    pool.meta["owner"][[1, 2]], pool.meta["state"][[1, 2]] = 3, WRITTEN
    pool.send("keyframe")
    frame(colors, (image, pool))
    assert image.last_update_pages == 2 and image.used_pages == 2
    expected = colors.owner_indices(pool.meta["owner"], pool.meta["state"])
    assert (image.owner_image.reshape(-1)[:1024] == expected).all()
    assert np.count_nonzero(image.counts) >= 2
