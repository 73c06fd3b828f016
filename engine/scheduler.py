"""Continuous batching over one page pool.

Each step: requests already running decode one token; waiting requests are admitted in
arrival order while a batch slot, the prefill token budget and free pages allow, and are
prefilled in the same step. A request reserves pages for its whole length (prompt +
max_new_tokens) when it starts, so it can never run out mid-generation and is never
preempted; one that does not fit the free pages waits. Finished requests free their
pages at once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.errors import PoolExhausted
from engine.kv.page_pool import PagePool
from engine.kv.page_table import PageTable
from engine.request import Request, RequestState


@dataclass
class ScheduledStep:
    prefill: list[Request] = field(default_factory=list)
    decode: list[Request] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.prefill and not self.decode


class Scheduler:
    def __init__(self, pool: PagePool, *, max_batch: int, max_prefill_tokens: int,
                 table_for: Callable[[Request], PageTable] | None = None,
                 release_table: Callable[[PageTable], object] | None = None):
        """table_for(request): its page table for its whole length, raising PoolExhausted
        (taking nothing) when it does not fit; release_table(table): give its pages back,
        returning the pages it named but did not own. Default: plain pool grants."""
        self.pool = pool
        self.table_for = table_for or self._grant
        self.release_table = release_table or (lambda table: pool.release(table.slot, table.pages))
        self.max_batch = max_batch
        self.max_prefill_tokens = max_prefill_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.stray_pages = 0  # table entries found not owned at release (reported, never freed)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, request: Request) -> None:
        request.state = RequestState.WAITING
        self.waiting.append(request)

    def schedule(self) -> ScheduledStep:
        step = ScheduledStep(decode=list(self.running))
        budget = self.max_prefill_tokens
        while self.waiting and len(self.running) < self.max_batch:
            request = self.waiting[0]
            # The budget bounds a step's prefill work but never starves a long prompt.
            if step.prefill and request.prompt_len > budget:
                break
            try:
                request.page_table = self.table_for(request)
            except PoolExhausted:
                break  # first come, first served: later requests do not overtake it
            request.state = RequestState.RUNNING
            self.waiting.popleft()
            self.running.append(request)
            step.prefill.append(request)
            budget -= request.prompt_len
        return step

    def release(self, request: Request) -> None:
        """Take a request out of the queues and free its pages (it is done)."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        if request.page_table is not None:
            # a stale table may name pages that are no longer this request's: free only its own
            self.stray_pages += len(self.release_table(request.page_table))
            request.page_table = None

    def _grant(self, request: Request) -> PageTable:
        grant = self.pool.allocate(request.slot, self.pool.pages_for_tokens(request.total_tokens))
        return PageTable.from_grant(request.slot, self.pool.page_size, grant)
