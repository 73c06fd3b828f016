"""RequestBook: every request the supervisor tracks, and the one place a request's phase
changes.

It owns the records (by id and by slot), the line of admitted requests waiting for a decode
worker (clients take turns in it), the requests whose reservation is under way, and the line of reserved requests
waiting for a prefill worker. Each method is one edge of the state machine below; an edge
not in it is a bug and raises (the supervisor's per-message guard turns that into an
`internal_error` alert and keeps serving):

    QUEUED -> RESERVING -> AWAITING_PREFILL -> PREFILLING -> DECODING -> FINISHED
                 |  (reserve failed, not final: back to the head of the line)
                 +-> QUEUED
    any phase not done -> FINISHED | FAILED | REJECTED | CANCELLED (end)
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import ValuesView
from typing import Any

from engine.errors import BudgetExceeded
from engine.server.fair_queue import FairQueue
from engine.server.request_record import DONE, RequestRecord
from engine.wire.states import Phase

EDGES = {
    Phase.QUEUED: {Phase.RESERVING},
    Phase.RESERVING: {Phase.AWAITING_PREFILL, Phase.QUEUED},
    Phase.AWAITING_PREFILL: {Phase.PREFILLING},
    Phase.PREFILLING: {Phase.DECODING},
    Phase.DECODING: set(),
}
KEEP_DONE = 5_000  # ended requests remembered (status, audit) before the oldest are forgotten (the journal keeps all)


class RequestBook:
    def __init__(self, keep_done: int = KEEP_DONE):
        self.records: dict[str, RequestRecord] = {}
        self.by_slot: dict[int, str] = {}
        self.queue = FairQueue()  # admitted, waiting for a decode worker: clients take turns
        self.reserving: set[str] = set()  # reserve sent, no answer yet
        self.awaiting_prefill: deque[str] = deque()  # reserved, waiting for a prefill worker
        self.keep_done = keep_done
        # per client (budget_key): live requests and their tokens (prompt + max_new_tokens)
        self.live_requests: Counter[str] = Counter()
        self.live_tokens: Counter[str] = Counter()

    # ---- lookups ----------------------------------------------------------------------
    def get(self, request_id: str) -> RequestRecord | None:
        return self.records.get(request_id)

    def __getitem__(self, request_id: str) -> RequestRecord:
        return self.records[request_id]

    def __contains__(self, request_id: object) -> bool:
        return request_id in self.records

    def __len__(self) -> int:
        return len(self.records)

    def values(self) -> ValuesView[RequestRecord]:
        return self.records.values()

    def slot_owner(self, slot: int) -> str | None:
        return self.by_slot.get(slot)

    def running(self) -> int:
        return sum(1 for r in self.records.values() if r.phase == Phase.DECODING)

    def waiting(self) -> int:
        return len(self.queue) + len(self.awaiting_prefill)

    def check_budget(self, key: str, request_id: str, tokens: int, max_requests: int, max_tokens: int) -> None:
        """Raise BudgetExceeded when one more request of `tokens` would take client `key` past
        its share: one client cannot fill the queue and starve the others."""
        if self.live_requests[key] + 1 > max_requests:
            raise BudgetExceeded(f"request {request_id}: this client has {self.live_requests[key]:,} requests "
                                 f"queued or running, the most one client may have "
                                 f"(engine.max_requests_per_client = {max_requests:,}); wait for some to end")
        if self.live_tokens[key] + tokens > max_tokens:
            raise BudgetExceeded(f"request {request_id}: {tokens:,} more tokens would give this client "
                                 f"{self.live_tokens[key] + tokens:,} queued or running, past "
                                 f"engine.max_tokens_per_client = {max_tokens:,}; wait for some to end")

    # ---- the edges ----------------------------------------------------------------------
    def admit(self, rec: RequestRecord) -> None:
        """A new request, QUEUED at the end of its client's line."""
        if rec.request_id in self.records and not self.records[rec.request_id].done:
            raise ValueError(f"request {rec.request_id!r} is already tracked")
        if rec.budget_key is not None:
            self.live_requests[rec.budget_key] += 1
            self.live_tokens[rec.budget_key] += rec.budget_tokens
        rec.phase = Phase.QUEUED
        self.records[rec.request_id] = rec
        self.by_slot[rec.slot] = rec.request_id
        self.queue.append(rec.request_id, rec.fair_key)

    def reserve(self, rec: RequestRecord) -> None:
        """The head of the line goes to a decode worker to reserve its pages (which one:
        Placement)."""
        if not self.queue or self.queue[0] != rec.request_id:
            raise ValueError(f"request {rec.request_id} is not at the head of the line")
        self._move(rec, Phase.RESERVING)
        self.queue.popleft()
        self.reserving.add(rec.request_id)

    def reserved(self, rec: RequestRecord, reservation: dict[str, Any]) -> None:
        self._move(rec, Phase.AWAITING_PREFILL)
        self.reserving.discard(rec.request_id)
        rec.reservation = reservation
        self.awaiting_prefill.append(rec.request_id)

    def reserve_failed(self, rec: RequestRecord) -> None:
        """Not final: back to the head of the line (it keeps its place)."""
        self._move(rec, Phase.QUEUED)
        self.reserving.discard(rec.request_id)
        self.queue.appendleft(rec.request_id, rec.fair_key)

    def answered(self, request_id: str) -> None:
        """A reservation answer came for a request that may have ended meanwhile."""
        self.reserving.discard(request_id)

    def next_for_prefill(self) -> RequestRecord | None:
        return self.records[self.awaiting_prefill[0]] if self.awaiting_prefill else None

    def prefill(self, rec: RequestRecord) -> None:
        if not self.awaiting_prefill or self.awaiting_prefill[0] != rec.request_id:
            raise ValueError(f"request {rec.request_id} is not next for prefill")
        self._move(rec, Phase.PREFILLING)
        self.awaiting_prefill.popleft()

    def decoding(self, rec: RequestRecord) -> None:
        self._move(rec, Phase.DECODING)

    def end(self, rec: RequestRecord, phase: Phase, reason: str, error: dict[str, Any] | None = None,
            now: float | None = None) -> bool:
        """End a request once (FINISHED, FAILED, REJECTED or CANCELLED). False when it had
        already ended: nothing changes."""
        if phase not in DONE:
            raise ValueError(f"{phase.value} does not end a request")
        if rec.done:
            return False
        rec.phase, rec.finish_reason, rec.error = phase, reason, error
        rec.finished_at = time.monotonic() if now is None else now
        if rec.budget_key is not None:
            key = rec.budget_key
            self.live_requests[key] -= 1
            self.live_tokens[key] -= rec.budget_tokens
            if self.live_requests[key] <= 0:
                del self.live_requests[key], self.live_tokens[key]  # a client that went is not kept
        for line in (self.queue, self.awaiting_prefill):
            if rec.request_id in line:
                line.remove(rec.request_id)
        self.reserving.discard(rec.request_id)
        return True

    def forget_old(self) -> None:
        """Past twice keep_done records, forget the oldest ended ones down to keep_done."""
        if len(self.records) > 2 * self.keep_done:
            done = [rid for rid, r in self.records.items() if r.done]
            for rid in done[: len(self.records) - self.keep_done]:
                self.by_slot.pop(self.records[rid].slot, None)
                del self.records[rid]

    def _move(self, rec: RequestRecord, to: Phase) -> None:
        if rec.done or to not in EDGES[rec.phase]:
            raise ValueError(f"request {rec.request_id}: no transition {rec.phase.value} -> {to.value}")
        rec.phase = to
