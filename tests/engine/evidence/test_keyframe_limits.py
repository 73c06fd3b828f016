"""A journal's keyframes are read back inside limits: the journal may come from another machine
and hold anything, so a keyframe whose .npz inflates past what a pool's keyframe can be, holds
too many arrays, or is damaged is a JournalError naming it and the limit, before it is inflated;
a real one reads back whole."""

from __future__ import annotations

import io
import time
import zipfile

import numpy as np
import pytest

from engine.evidence.journal import Journal
from engine.evidence.journal_read import JournalError
from engine.evidence.journal_source import JournalSource
from engine.evidence.keyframe_arrays import MAX_ARRAYS, MAX_INFLATED_BYTES


def journal_with(path, keyframes: dict[str, bytes]) -> None:
    journal = Journal(path, run_info={"control": "tcp://127.0.0.1:1", "host": "h"}, max_age_s=86_400.0,
                      max_bytes=1 << 30)
    for pool, arrays in keyframes.items():
        journal.keyframe(time.time(), pool, "test", arrays)
    journal.close()


def npz(**arrays) -> bytes:
    out = io.BytesIO()
    np.savez(out, **arrays)
    return out.getvalue()


def bomb() -> bytes:
    """An .npz whose one member inflates to just past the limit from about 130 KB."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("owner.npy", bytes(MAX_INFLATED_BYTES + 1))
    return out.getvalue()


def many() -> bytes:
    return npz(**{f"a{i}": np.zeros(1, np.int32) for i in range(MAX_ARRAYS + 1)})


def test_a_real_keyframe_reads_back_and_hostile_ones_are_named_before_inflating(tmp_path):
    owner = np.arange(8, dtype=np.int32)
    journal_with(tmp_path / "j.sqlite", {"decode-0": npz(owner=owner), "bomb": bomb(), "many": many(),
                                         "torn": npz(owner=owner)[:-40]})
    with JournalSource(tmp_path / "j.sqlite") as source:
        assert np.array_equal(source.page_metadata("decode-0")["owner"], owner)
        with pytest.raises(JournalError, match=rf"pool 'bomb'.* declares {MAX_INFLATED_BYTES + 1:,} bytes inflated "
                                               rf"\(limit {MAX_INFLATED_BYTES:,}\); nothing of it was inflated"):
            source.page_metadata("bomb")
        with pytest.raises(JournalError, match=rf"pool 'many'.* holds {MAX_ARRAYS + 1} arrays \(limit {MAX_ARRAYS}\)"):
            source.page_metadata("many")
        with pytest.raises(JournalError, match="pool 'torn'.* cannot be read: BadZipFile"):
            source.page_metadata("torn")
