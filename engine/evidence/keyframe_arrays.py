"""A journal keyframe's arrays (an .npz the evidence feed wrote), read back inside limits.

A journal is read after the engine that wrote it is gone, often on another machine (`main.py
snapshot --journal FILE`, the app's view of a previous run): its bytes are whatever the file
holds now. A keyframe's .npz is checked from its zip directory before a byte is inflated (how
many arrays, the size each declares, the total), and numpy then reads each array only up to
its declared size, never a pickled one. Past a limit: JournalError naming the keyframe, the
value and the limit.
"""

from __future__ import annotations

import io
import zipfile

import numpy as np

from engine.evidence.journal_read import JournalError
from engine.wire.protocol import MAX_CONTROL_FRAME, OPTIONAL_PAGE_FIELDS, PAGE_FIELDS

# One pool's page fields, as the feed writes them (its keyframe came in telemetry frames of at
# most MAX_CONTROL_FRAME each); a little room for fields added later.
MAX_ARRAYS = 2 * (len(PAGE_FIELDS) + len(OPTIONAL_PAGE_FIELDS))
MAX_INFLATED_BYTES = 2 * MAX_CONTROL_FRAME


def read_keyframe(data: bytes, what: str) -> dict[str, np.ndarray]:
    """The arrays of one keyframe's .npz (`what` names it in errors)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as npz:
            infos = npz.infolist()
            if len(infos) > MAX_ARRAYS:
                raise JournalError(f"{what} holds {len(infos):,} arrays (limit {MAX_ARRAYS}); nothing of it was "
                                   "inflated")
            declared = sum(info.file_size for info in infos)
            if declared > MAX_INFLATED_BYTES:
                raise JournalError(f"{what} declares {declared:,} bytes inflated (limit {MAX_INFLATED_BYTES:,}); "
                                   "nothing of it was inflated")
        # zipfile stops a member at its declared size, so numpy can read no more than that
        with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
            return {name: arrays[name].copy() for name in arrays.files}
    except JournalError:
        raise
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise JournalError(f"{what} cannot be read: {type(exc).__name__}: {str(exc)[:200]}") from None
