"""ReadLog: which requests read whose data, through which pages, when — and scoping.

Decode workers report every cross-request read that really happened (their per-token
provenance says whose content a read token held) and every I1 detection. An incident makes
millions of them, so the log keeps aggregates, not reads: per second, per (source, reader)
pair, the pages, the first and last time and the count. That is what `scope(since, until)`
answers (the affected pairs), resolved to the second: a second partly inside the window
counts whole. At most `max_buckets` (second, pair) aggregates are kept, oldest dropped first
and counted, so a scope reaching back before `complete_since` says it may be incomplete.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from engine.evidence.scope_pairs import sorted_pairs

MAX_BUCKETS = 200_000
BUCKET_S = 1.0
MAX_PAIRS = 100_000  # distinct (source, reader) pairs remembered for "is this pair new?"
RECENT_PAIRS = 50  # the newest new pairs, for status (the app's data-crossed banner)


@dataclass(frozen=True)
class ReadRecord:
    time: float
    reader: str  # request id of the request that read
    reader_slot: int
    source: str | None  # request id whose content it received (None if unknown by now)
    source_slot: int
    pool: str
    page: int


@dataclass
class _Bucket:
    source: str | None
    reader: str
    first: float
    last: float
    reads: int = 0
    pages: set = field(default_factory=set)


class ReadLog:
    def __init__(self, max_buckets: int = MAX_BUCKETS):
        self.max_buckets = max_buckets
        self.buckets: OrderedDict[tuple[int, int, int], _Bucket] = OrderedDict()
        self.total = 0  # every read ever added
        self.dropped_reads = 0  # reads in aggregates dropped for room
        self.complete_since: float | None = None  # everything after this is kept (None: nothing dropped)
        self.pairs_seen: set[tuple[int, int]] = set()  # (source slot, reader slot), at most MAX_PAIRS
        self.pair_count = 0  # distinct pairs ever (the sequence number of the newest)
        self.recent_pairs: deque[dict] = deque(maxlen=RECENT_PAIRS)
        self.dirty: set[tuple[int, int, int]] | None = None  # buckets changed since take_dirty() (None: not tracked)

    def add(self, record: ReadRecord) -> None:
        self.total += 1
        pair = (record.source_slot, record.reader_slot)
        if pair not in self.pairs_seen:
            if len(self.pairs_seen) >= MAX_PAIRS:
                self.pairs_seen.clear()  # forget the oldest generation; a pair may count twice
            self.pairs_seen.add(pair)
            self.pair_count += 1
            self.recent_pairs.append({"seq": self.pair_count, "time": record.time, "source": record.source,
                                      "source_slot": record.source_slot, "reader": record.reader,
                                      "reader_slot": record.reader_slot})
        key = (int(record.time // BUCKET_S), record.source_slot, record.reader_slot)
        bucket = self.buckets.get(key)
        if bucket is None:
            bucket = self.buckets[key] = _Bucket(record.source, record.reader, record.time, record.time)
            if len(self.buckets) > self.max_buckets:
                _, old = self.buckets.popitem(last=False)
                self.dropped_reads += old.reads
                self.complete_since = max(self.complete_since or old.last, old.last)
        elif bucket.source is None and record.source is not None:
            bucket.source = record.source  # the source became known
        bucket.reads += 1
        bucket.pages.add((record.pool, record.page))
        if self.dirty is not None:
            self.dirty.add(key)
        if record.time < bucket.first:
            bucket.first = record.time
        elif record.time > bucket.last:
            bucket.last = record.time

    def track_changes(self) -> None:
        """From now on remember which buckets changed, for take_dirty() (the evidence journal)."""
        if self.dirty is None:
            self.dirty = set()

    def take_dirty(self) -> list[tuple[tuple[int, int, int], "_Bucket"]]:
        """The buckets changed since the last call, as (key, bucket); forgets them."""
        if not self.dirty:
            return []
        out = [(key, self.buckets[key]) for key in self.dirty if key in self.buckets]
        self.dirty = set()
        return out

    def scope(self, since: float | None = None, until: float | None = None) -> list[dict]:
        """Affected pairs in [since, until]: who received data written by whom, through which
        pages, first and last time, how many reads. Sorted by (source slot, reader slot)."""
        since = -1.0 if since is None else since
        until = time.time() + 1e9 if until is None else until
        pairs: dict[tuple, dict] = {}
        for (_, source_slot, reader_slot), b in self.buckets.items():
            if b.last < since or b.first > until:
                continue
            pair = pairs.get((source_slot, reader_slot))
            if pair is None:
                pair = pairs[(source_slot, reader_slot)] = {
                    "source": b.source, "source_slot": source_slot, "reader": b.reader, "reader_slot": reader_slot,
                    "pages": set(), "first": b.first, "last": b.last, "reads": 0}
            if pair["source"] is None:
                pair["source"] = b.source
            pair["pages"] |= b.pages
            pair["first"], pair["last"] = min(pair["first"], b.first), max(pair["last"], b.last)
            pair["reads"] += b.reads
        return sorted_pairs(pairs)

    def incomplete_before(self, since: float | None) -> float | None:
        """The time before which reads in a window starting at `since` were dropped (None: the
        window is complete)."""
        if self.complete_since is None or (since is not None and since > self.complete_since):
            return None
        return self.complete_since
