"""The shape `scope` answers in, shared by the live read log and the journal's reader."""

from __future__ import annotations


def sorted_pairs(pairs: dict) -> list[dict]:
    """Affected pairs keyed by (..., source slot, reader slot), in key order, each one's page
    set as a sorted [[pool, page], ...] list."""
    out = []
    for key in sorted(pairs):
        pair = pairs[key]
        pair["pages"] = [[pool, page] for pool, page in sorted(pair["pages"])]
        out.append(pair)
    return out
