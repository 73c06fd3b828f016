"""CrossingWatch: has data crossed between requests since the operator last looked? (Qt-free)

The engine counts distinct (source, reader) pairs whose data crossed and sends the newest in
`status["crossings"]`. An alert that is already firing only grows its count when a second
leak happens, so the window needs its own notion of "new": a pair the operator has not
acknowledged. `update()` returns the pairs that are new since the last update (one
notification each); the banner shows while any pair is unacknowledged, and `acknowledge()`
clears it until the next new pair.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

CARRIED_KEPT = 20  # pairs of earlier engine runs kept for the banner to name


def tenant_sentence(reader_tenant: str | None, source_tenant: str | None) -> str:
    """"tenant A received tenant B's data"; a side whose tenant is not known is named so. The
    banner and the alert detail's incident scope both say it this way."""
    reader = f"tenant {reader_tenant}" if reader_tenant else "a request of no known tenant"
    source = f"tenant {source_tenant}'s data" if source_tenant else "data of a request of no known tenant"
    return f"{reader} received {source}"


@dataclass(frozen=True)
class Crossing:
    seq: int
    time: float
    source: str | None
    reader: str | None
    source_tenant: str | None
    reader_tenant: str | None

    def sentence(self) -> str:
        def who(rid, tenant):
            name = rid if rid is not None else "an unknown request"
            return f"{name} (tenant {tenant})" if tenant else name

        return f"{who(self.reader, self.reader_tenant)} received data of {who(self.source, self.source_tenant)}"


class CrossingWatch:
    def __init__(self):
        self.pairs = 0  # distinct pairs the engine counted
        self.reads = 0
        self.acknowledged = 0  # pairs the operator has seen (a sequence number)
        self.recent: list[Crossing] = []  # newest last
        self.last_new_at: float | None = None  # wall-clock time of the newest pair
        self.engine_epoch: object = None  # a new engine (restart): its counts start again
        # pairs of engine runs before this one that the operator had not acknowledged: a
        # restart must not acknowledge them on the operator's behalf
        self.carried = 0
        self.carried_recent: list[Crossing] = []

    def update(self, crossings: dict | None, engine_epoch: object = None) -> list[Crossing]:
        """Take one status' crossings; returns the pairs not announced before."""
        if not isinstance(crossings, dict):
            return []
        if engine_epoch != self.engine_epoch:  # another engine (or a restart): counts begin at 0
            if self.engine_epoch is not None and self.pairs > self.acknowledged:
                self.carried += self.pairs - self.acknowledged
                self.carried_recent = (self.carried_recent + self.recent)[-CARRIED_KEPT:]
            self.engine_epoch = engine_epoch
            self.pairs = self.acknowledged = 0
            self.recent = []
        pairs = int(crossings.get("pairs") or 0)
        self.reads = int(crossings.get("reads") or 0)
        recent = []
        for p in crossings.get("recent") or []:
            try:
                recent.append(Crossing(int(p["seq"]), float(p["time"]), p.get("source"), p.get("reader"),
                                       p.get("source_tenant"), p.get("reader_tenant")))
            except (KeyError, TypeError, ValueError):
                continue  # a malformed entry is skipped, the count still holds
        announced = self.pairs  # every pair up to the last count was announced then
        self.pairs, self.recent = max(self.pairs, pairs), recent
        if recent:
            self.last_new_at = max(c.time for c in recent)
        new = [c for c in recent if c.seq > announced]
        if self.pairs > announced and not new:  # more new pairs than the engine lists
            new = recent[-1:]
        return new

    @property
    def unacknowledged(self) -> int:
        return self.carried + max(0, self.pairs - self.acknowledged)

    def acknowledge(self) -> None:
        self.acknowledged = self.pairs
        self.carried, self.carried_recent = 0, []

    def known(self) -> list[Crossing]:
        """Every pair this window can still name, oldest first (earlier runs' unacknowledged, then this run's)."""
        return self._shown()

    def _shown(self) -> list[Crossing]:
        """The newest pairs the banner can name: the carried ones of earlier runs, then this run's."""
        return self.carried_recent + self.recent

    def tenants(self) -> set[tuple[str | None, str | None]]:
        """(reader tenant, source tenant) pairs among the recent crossings (None: not known)."""
        return {(c.reader_tenant or None, c.source_tenant or None) for c in self._shown()}

    def lines(self, limit: int = 3) -> list[str]:
        """The banner's text: counts, tenants, the newest pairs and when the last one came."""
        if not self.unacknowledged:
            return []
        when = time.strftime("%H:%M:%S", time.localtime(self.last_new_at)) if self.last_new_at else "?"
        new = self.unacknowledged
        counts = f"{self.pairs:,} in all, {self.reads:,} cross reads"
        if self.carried:
            counts = (f"{counts} in this engine run; {self.carried:,} unacknowledged from before the engine "
                      "restarted")
        head = f"{new:,} new pair(s) of requests since you last acknowledged ({counts}); last new pair at {when}"
        tenants = sorted(self.tenants(), key=lambda pair: (pair[0] or "", pair[1] or ""))
        out = [head]
        if tenants:
            out.append("Tenants: " + ", ".join(tenant_sentence(r, s) for r, s in tenants[:6])
                       + (" …" if len(tenants) > 6 else ""))
        out += [c.sentence() for c in reversed(self._shown()[-limit:])]
        return out
