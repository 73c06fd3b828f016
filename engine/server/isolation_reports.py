"""IsolationReports: what a worker's isolation report becomes: alerts, audit events, the read log.

A decode worker reports two kinds of event after its steps: an I1 detection
(`ownership_violation`: a request met token slots it did not write in this epoch) and a
cross-request read it saw happen (`cross_read`, the ground truth the detectors are judged
against). A canary's data in either is a `canary_leak` too.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from engine.guard.canaries import CanaryBook
from engine.guard.read_log import ReadLog, ReadRecord
from engine.server.audit import AuditLog

Alert = Callable[..., None]  # Supervisor.alert(kind, severity, detail, *, subject, condition, **fields)


class IsolationReports:
    def __init__(self, *, reads: ReadLog, canaries: CanaryBook, audit: AuditLog, alert: Alert,
                 slot_owner: Callable[[int], str | None], counters: Counter[str]):
        """slot_owner(slot): the request id a slot was given to (None: forgotten)."""
        self.reads, self.canaries, self.audit, self.alert = reads, canaries, audit, alert
        self.slot_owner, self.counters = slot_owner, counters

    def report(self, events: list[Any]) -> None:
        """One report's events; anything that is not a known event is skipped."""
        for event in events:
            if not isinstance(event, dict):
                continue
            if event.get("kind") == "ownership_violation":
                self.ownership(event)
            elif event.get("kind") == "cross_read":
                self.cross_read(event)
        self.counters["isolation_events"] += 1

    def _request_of(self, slot: object) -> str | None:
        return self.slot_owner(int(slot)) if isinstance(slot, int) else None

    def ownership(self, event: dict[str, Any]) -> None:
        reader = str(event.get("request"))
        pages = [p for p in event.get("pages") or [] if isinstance(p, dict)]
        writers = sorted({w for p in pages for w in _writer_slots(p)})
        sources = [self._request_of(w) or f"slot {w}" for w in writers if w != event.get("slot")]
        prevented = bool(event.get("prevented"))
        how = "masked, request aborted" if prevented else "NOT prevented (defence off or report_only)"
        found = ", ".join(f"{n} {what}" for n, what in (
            (event.get("foreign_slots"), "token slot(s) another request wrote"),
            (event.get("unwritten_slots"), "slot(s) nothing wrote this epoch"),
            (event.get("stale_pages"), "page(s) its block table names but it does not own")) if isinstance(n, int) and n)
        detail = (f"request {reader} met {len(pages)} page(s) of pool {event.get('pool')} it does not own "
                  f"in this epoch{': ' + found if found else ''} ({how}); written by "
                  f"{', '.join(sources) or 'nobody this epoch'}")
        self.audit.record(reader, "ownership_violation", pages=pages, prevented=prevented,
                          foreign_slots=event.get("foreign_slots"), unwritten_slots=event.get("unwritten_slots"),
                          stale_pages=event.get("stale_pages"))
        self.alert("ownership_violation", "critical", detail, subject=str(event.get("pool")),
                   requests=[reader, *[s for s in sources if not s.startswith("slot")]],
                   pages=[p["page"] for p in pages], prevented=prevented, reader=reader, pool=str(event.get("pool")))
        for writer in writers:
            if self.canaries.is_canary_slot(writer) and not self.canaries.is_canary_slot(event.get("slot")):
                self._canary_leak(self.canaries.by_slot[writer].request_id, reader,
                                  [p["page"] for p in pages if writer in _writer_slots(p)], prevented)

    def cross_read(self, event: dict[str, Any]) -> None:
        reader, slot = str(event.get("request")), int(event.get("slot", -1))
        when = float(event.get("time", time.time()))
        canary_pages: dict[int, list[int]] = {}
        for page, source in event.get("reads") or []:
            self.reads.add(ReadRecord(when, reader, slot, self._request_of(source), int(source),
                                      str(event.get("pool")), int(page)))
            if self.canaries.is_canary_slot(source) and not self.canaries.is_canary_slot(slot):
                canary_pages.setdefault(int(source), []).append(int(page))
        self.counters["cross_reads"] += len(event.get("reads") or [])
        self.audit.record(reader, "cross_read", reads=event.get("reads"), pool=event.get("pool"))
        for source, pages in canary_pages.items():
            self._canary_leak(self.canaries.by_slot[source].request_id, reader, pages, False)

    def _canary_leak(self, canary: str, reader: str, pages: list[int], prevented: bool) -> None:
        how = "the read was masked" if prevented else "the data WAS read"
        self.alert("canary_leak", "critical", f"request {reader} touched pages written by canary {canary} ({how})",
                   subject=reader, requests=[canary, reader], pages=pages, prevented=prevented,
                   source=canary, reader=reader)


def _writer_slots(page: dict[str, Any]) -> list[int]:
    """The slots that wrote a page's failing token slots, from a worker's report (`writers`,
    or the older single `writer`): none when nobody did (`writer: null`) or a field is not the
    expected [slot, epoch] pair."""
    writers = page.get("writers")
    if not isinstance(writers, list):
        writers = [page.get("writer")]
    return [w[0] for w in writers if isinstance(w, (list, tuple)) and w and isinstance(w[0], int)]
