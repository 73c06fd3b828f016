"""PrefillWorker: runs prompts into its own pool and ships the pages to a decode worker.

A job names the decode worker's reservation (request, epoch, page ids, token count). The
worker computes the prompt's K/V in its own pages, checks that those pages carry its own
writer tags (I1 on the prefill side), samples the first token, and sends a transfer
(manifest + page bytes, zero-copy) straight to the decode worker. Its pages are freed
once ZeroMQ has let go of the bytes.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch
import zmq

from engine.errors import OwnershipViolation, PoolExhausted, SamplingFailed
from engine.isolate import each_alone
from engine.kv.page_table import PageTable
from engine.request import Request, SamplingParams
from engine.sampling import sample_next
from engine.wire.messages import to_supervisor as report
from engine.wire.messages import to_worker as command
from engine.wire.page_tags import pack_tag
from engine.wire.protocol import ProtocolError, unpack_header
from engine.wire.sockets import harden, send_zero_copy
from engine.workers.loop import WorkerLoop
from engine.workers.transfer.send import iter_transfer


@dataclass
class PrefillJob:
    request: Request
    endpoint: str
    reservation: dict
    started: float = 0.0


@dataclass
class Shipment:
    """A request's pages, whose bytes ZeroMQ may still be reading."""

    tracker: zmq.MessageTracker
    table: PageTable


def params_from_wire(d: dict) -> SamplingParams:
    return SamplingParams(
        max_new_tokens=int(d.get("max_new_tokens", 16)), temperature=float(d.get("temperature", 0.0)),
        top_k=int(d.get("top_k", 0)), top_p=float(d.get("top_p", 1.0)), seed=d.get("seed"),
        ignore_eos=bool(d.get("ignore_eos", False)), stop_token_ids=tuple(d.get("stop_token_ids", ())),
    )


def _drop_last_page(messages: list[list]) -> list[list]:
    """short_transfer fault: the last page frame never leaves, though the manifest counts it."""
    last = messages[-1]
    count = unpack_header(last[0])["count"]
    messages[-1] = last[:count] + last[count + 1:]
    return messages


class PrefillWorker(WorkerLoop):
    role = "prefill"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.jobs: deque[PrefillJob] = deque()
        self.shipping: list[Shipment] = []
        self.pushes: dict[str, zmq.Socket] = {}
        self.generators: dict[str, torch.Generator] = {}
        self.sent_ids: deque[str] = deque(maxlen=4096)  # to answer a cancel that came too late
        self._computed = False  # whether the last turn started a batch (computes_next)
        self.apply_guard(self.engine.config)

    def apply_guard(self, config) -> None:
        super().apply_guard(config)
        self.faults = config.faults

    def busy(self) -> bool:
        return bool(self.jobs or self.shipping)

    def computes_next(self) -> bool:
        # shipping pages to decode computes nothing, nor waiting for free pages
        return bool(self.jobs) and self._computed

    # ---- commands ---------------------------------------------------------------------
    def on_prefill(self, cmd: command.Prefill) -> None:
        request = Request(cmd.request_id, cmd.prompt_ids, params_from_wire(cmd.params), tenant=cmd.tenant,
                          slot=cmd.slot, salt=self.engine.salt_for(cmd.tenant, cmd.cache_salt))
        self.jobs.append(PrefillJob(request, cmd.target.endpoint, cmd.target.reservation))

    def on_forget_endpoint(self, cmd: command.ForgetEndpoint) -> None:
        push = self.pushes.pop(cmd.endpoint, None)
        if push is not None:
            push.close(linger=0)

    def on_cancel(self, cmd: command.Cancel) -> None:
        request_id = cmd.request_id
        for job in list(self.jobs):
            if job.request.request_id == request_id:
                self.jobs.remove(job)
                self.send(report.CancelAck(request_id=request_id, sent=False))
                return
        # Already shipped (or never seen): nothing more will be sent for it.
        self.send(report.CancelAck(request_id=request_id, sent=request_id in self.sent_ids))

    # ---- work -------------------------------------------------------------------------
    def work(self) -> None:
        self._release_shipped()
        batch = self._start_batch()
        self._computed = bool(batch)
        if not batch:
            return
        jobs = {job.request.request_id: job for job in batch}
        for requests, logits in each_alone(self.engine.runner.prefill, self._checked_prefixes(batch),
                                           self._fail_job, "prefill"):
            for request, token in zip(requests, sample_next(logits, requests, self.generators)):
                # a prefill draws one token; the decode worker draws the rest with its own
                # generator. Kept, one torch.Generator per sampled request (~1.5 KB a request
                # averaged over a soak) grew this worker for as long as it ran.
                self.generators.pop(request.request_id, None)
                if isinstance(token, SamplingFailed):  # this request alone fails; the batch ships
                    self._fail_job(request, token)
                else:
                    self._ship(jobs[request.request_id], token)

    def _fail_job(self, request: Request, error) -> None:
        self.engine.release_table(request.page_table)
        self.send(report.PrefillFailed(request_id=request.request_id, error=error.to_wire()))

    def _checked_prefixes(self, batch: list[PrefillJob]) -> list[Request]:
        """I1 over the cached prefix each job is about to attend (the engine's rule): a job whose
        prefix fails it is refused before it reads it (the defence on) or reported (off); a
        prefix read goes into the provenance audit."""
        engine = self.engine
        prevent = engine.runner.check_writer_tags and engine.config.engine.ownership_policy == "abort"
        go = []
        for job in batch:
            request = job.request
            if request.cached_tokens:
                foreign, unwritten, pages = engine.runner.prefix_violations(request)
                if foreign or unwritten:
                    detail = (f"prefill pool {engine.pool.name!r}: request {request.request_id} found "
                              f"{foreign} foreign and {unwritten} unwritten token slot(s) in the cached prefix "
                              f"it was about to read (pages {pages[:8]}): a shared page whose tags or prefix key "
                              f"are not its own")
                    self.alert("ownership_violation", "critical", detail, requests=[request.request_id],
                               pages=pages, prevented=prevent)
                    if engine.cache is not None:
                        engine.cache.withdraw(pages)
                    if prevent:
                        self._fail_job(request, OwnershipViolation(detail))
                        continue
                reads = engine.runner.prefix_cross_reads(request)
                if len(reads):
                    engine._record_cross_reads(request, reads)
            go.append(request)
        self.forward_events()
        return go

    def _start_batch(self) -> list[PrefillJob]:
        """Jobs that fit the prefill budget and the pool's free pages, in arrival order."""
        batch, budget, pool = [], self.engine.config.engine.max_prefill_tokens, self.engine.pool
        while self.jobs:
            job = self.jobs[0]
            request = job.request
            if batch and request.prompt_len > budget:
                break
            if pool.pages_for_tokens(request.prompt_len) > pool.num_pages:
                # admitted under a larger pool (a reconfigure shrank it): it can never run here
                self.jobs.popleft()
                self.send(report.PrefillFailed(request_id=request.request_id, error={
                    "code": "admission_rejected",
                    "message": f"request {request.request_id}: prompt of {request.prompt_len:,} tokens exceeds "
                               f"prefill pool {pool.name!r} of {pool.capacity_tokens:,} tokens"}))
                continue
            try:
                # never more cached pages than the decode side has: the pages it lacks must be
                # this request's own, computed here
                request.page_table = self.engine.table_for(
                    request, tokens=request.prompt_len, reuse=int(job.reservation.get("first_page", 0)))
            except PoolExhausted:
                break  # pages come back as shipments complete
            job.started = time.monotonic()
            batch.append(self.jobs.popleft())
            budget -= request.prompt_len
        return batch

    def _ship(self, job: PrefillJob, first_token: int) -> None:
        request, pool = job.request, self.engine.pool
        first = int(job.reservation.get("first_page", 0))
        pages = request.page_table.pages[first:]  # the decode side holds the ones before
        problem = self._own_pages_problem(request, first)
        if problem:
            self.alert("ownership_violation", "critical", problem, requests=[request.request_id],
                       pages=[int(p) for p in pages])
            self.engine.release_table(request.page_table)
            self.send(report.PrefillFailed(request_id=request.request_id,
                                           error={"code": "ownership_violation", "message": problem}))
            return
        push = self._push(job.endpoint)
        trackers: list[zmq.MessageTracker] = []
        try:
            # each chunk is checksummed just before it goes, so sending starts at once
            messages = iter_transfer(pool, pages, job.reservation, first_token=first_token, sender=self.name,
                                     tokens=request.prompt_len)
            if self.faults.short_transfer:
                messages = _drop_last_page(list(messages))
            for frames in messages:  # the pages stay unfreed until ZeroMQ lets go of every chunk's frames
                trackers.append(send_zero_copy(push, frames))
        except (ProtocolError, ValueError) as exc:  # a reservation that cannot be honoured
            self.shipping.append(Shipment(zmq.MessageTracker(*trackers), request.page_table))
            self.send(report.PrefillFailed(request_id=request.request_id,
                                           error={"code": "transfer_mismatch", "message": f"{self.name}: {exc}"}))
            return
        self.engine.offer_prompt(request)  # read-only from now: later prompts may take its full pages
        self.shipping.append(Shipment(zmq.MessageTracker(*trackers), request.page_table))
        self.sent_ids.append(request.request_id)
        self.send(report.Prefilled(
            request_id=request.request_id, first_token=first_token, tokens=request.prompt_len, pages=len(pages),
            chunks=len(trackers), elapsed_s=time.monotonic() - job.started,
        ))

    def _own_pages_problem(self, request: Request, first: int = 0) -> str | None:
        """I1 on the prefill side: every prompt token slot about to be shipped (pages from
        `first` on) was written by this request in this epoch."""
        pool, table = self.engine.pool, request.page_table
        pages = table.pages[first:]
        idx = torch.from_numpy(pages.astype(np.int64)).to(pool.device)
        tags = pool.token_writer[idx].cpu().numpy()
        expected = pack_tag(np.int64(request.slot), table.epochs[first:])
        needed = np.minimum(pool.page_size, request.prompt_len - np.arange(first, len(table.pages)) * pool.page_size)
        wanted = np.arange(pool.page_size)[None, :] < needed[:, None]
        wrong = wanted & (tags != expected[:, None])
        bad = np.nonzero(wrong.any(axis=1))[0]
        if not len(bad):
            return None
        j = int(bad[0])
        slot = int(np.nonzero(wrong[j])[0][0])
        return (f"prefill pool {pool.name!r}: page {int(pages[j])} of request {request.request_id} "
                f"has {int(wrong[j].sum())} prompt token slot(s) it did not write this epoch (slot {slot}: "
                f"tag {int(tags[j, slot])}, expected {int(expected[j])}); not shipped")

    def _push(self, endpoint: str) -> zmq.Socket:
        push = self.pushes.get(endpoint)
        if push is None:
            push = harden(self.ctx.socket(zmq.PUSH), "kv")
            push.connect(endpoint)
            self.pushes[endpoint] = push
        return push

    def _release_shipped(self) -> None:
        still = []
        for shipment in self.shipping:
            if shipment.tracker.done:
                self.engine.release_table(shipment.table)
            else:
                still.append(shipment)
        self.shipping = still

    def close(self) -> None:
        for push in self.pushes.values():
            push.close(linger=0)
        super().close()
