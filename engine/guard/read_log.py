"""ReadLog: which requests read whose data, through which pages, when — and scoping.

Decode workers report every cross-request read that really happened (their per-token
provenance says whose content a read token held) and every I1 detection. The log keeps them
bounded and answers `scope(since, until)`: the affected pairs, each with its pages and times.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

MAX_RECORDS = 200_000


@dataclass(frozen=True)
class ReadRecord:
    time: float
    reader: str  # request id of the request that read
    reader_slot: int
    source: str | None  # request id whose content it received (None if unknown by now)
    source_slot: int
    pool: str
    page: int


class ReadLog:
    def __init__(self, max_records: int = MAX_RECORDS):
        self.records: deque[ReadRecord] = deque(maxlen=max_records)
        self.total = 0

    def add(self, record: ReadRecord) -> None:
        self.records.append(record)
        self.total += 1

    def scope(self, since: float | None = None, until: float | None = None) -> list[dict]:
        """Affected pairs in [since, until]: who received data written by whom, through which
        pages, first and last time. Sorted by (source, reader)."""
        since = -1.0 if since is None else since
        until = time.time() + 1e9 if until is None else until
        pairs: dict[tuple, dict] = {}
        for r in self.records:
            if not since <= r.time <= until:
                continue
            key = (r.source_slot, r.reader_slot)
            pair = pairs.get(key)
            if pair is None:
                pair = pairs[key] = {"source": r.source, "source_slot": r.source_slot, "reader": r.reader,
                                     "reader_slot": r.reader_slot, "pages": set(), "first": r.time,
                                     "last": r.time, "reads": 0}
            pair["pages"].add((r.pool, r.page))
            pair["first"], pair["last"] = min(pair["first"], r.time), max(pair["last"], r.time)
            pair["reads"] += 1
        out = []
        for key in sorted(pairs):
            pair = pairs[key]
            pair["pages"] = [[pool, page] for pool, page in sorted(pair["pages"])]
            out.append(pair)
        return out
