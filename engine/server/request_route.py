"""RequestRoute: a served request's route through the supervisor, in the order it happens.

    admitted (ControlOps) -> queued ................................ placed()
    a decode worker with room reserves its pages ..................... dispatch() -> `reserve`
        reserved / reserve_failed ...................................... reserved(), reserve_failed()
    a prefill worker computes the prompt, ships its pages ............ dispatch_prefill() -> `prefill`
        prefilled / prefill_failed ..................................... prefilled(), prefill_failed()
    the decode worker checks the transfer (I3, I4) .................... transfer_done()
    tokens stream back to the client ................................. tokens()
    the end, once: the client hears `done`, the workers let go ......... finish()
    off the route: cancel(), a worker that went (worker_gone()), no worker of a role
    ready for too long (fail_unplaced())

Phases change only in RequestBook; which worker holds a request only in Placement; a
worker's free pages only through WorkerHandle. This file decides what happens next.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from engine.config import EngineConfig
from engine.errors import NoWorker, PageWardenError
from engine.guard.canaries import CanaryBook
from engine.server.audit import AuditLog
from engine.server.metrics import MetricsWindow
from engine.server.outbox import Outbox
from engine.server.output_text import OutputText
from engine.server.placement import Placement
from engine.server.request_book import RequestBook
from engine.server.request_record import RequestRecord
from engine.server.worker_handle import WorkerHandle
from engine.server.worker_pool import WorkerPool
from engine.wire.messages import to_client, to_worker
from engine.wire.messages.codec import header_of
from engine.wire.protocol import CANARY_TENANT, ProtocolError, pack
from engine.wire.states import Phase, WorkerState

QUEUED_NEEDS = ("decode", "prefill")  # what a queued request waits for, in the order it needs them
Alert = Callable[..., None]  # Supervisor.alert(kind, severity, detail, *, subject, condition, **fields)


class RequestRoute:
    def __init__(self, *, config: Callable[[], EngineConfig], book: RequestBook, workers: WorkerPool,
                 placement: Placement, outbox: Outbox, audit: AuditLog, metrics: MetricsWindow,
                 counters: Counter[str], canaries: CanaryBook, text: OutputText, alert: Alert,
                 publish: Callable[[RequestRecord], None]):
        """config(): the running config (a reconfigure replaces it). publish(rec): rec's state
        on the requests topic. alert: Supervisor.alert."""
        self.config, self.book, self.workers, self.placement = config, book, workers, placement
        self.outbox, self.audit, self.metrics, self.counters = outbox, audit, metrics, counters
        self.canaries, self.text, self.alert, self.publish = canaries, text, alert, publish
        self.progressed: set[str] = set()  # requests with new tokens since their last publish
        self._unplaced: set[str] = set()  # requests marked waiting for a worker (fail_unplaced)

    # ---- 1. queued ----------------------------------------------------------------------
    def placed(self, rec: RequestRecord) -> None:
        """A request just queued: say at once why it cannot be placed (no ready worker of a
        role), so that its `accepted`, status and audit agree from the first moment."""
        why = self._why_none_ready()
        blocked = next((role for role in QUEUED_NEEDS if why[role]), None)
        if blocked is not None:
            rec.waiting_for = why[blocked]
            self._unplaced.add(rec.request_id)  # fail_unplaced keeps it current from here

    # ---- 2. decode reserves -------------------------------------------------------------
    def dispatch(self) -> None:
        """Give queued requests to decode workers with room, reserved ones to prefill workers."""
        engine = self.config().engine
        # Reserve decode pages only for requests a prefill worker can take soon: pages held
        # for a request that waits on a missing prefill worker would be held for nothing.
        prefill_room = sum(engine.max_batch - len(w.inflight) for w in self.workers.role("prefill") if w.accepting)
        prefill_room -= len(self.book.awaiting_prefill) + len(self.book.reserving)
        while self.book.queue and prefill_room > 0:
            rec = self.book[self.book.queue[0]]
            need = -(-(rec.prompt_len + rec.params["max_new_tokens"]) // engine.page_size)
            decode = [w for w in self.workers.role("decode")
                      if w.accepting and len(w.inflight) < engine.max_batch and w.free_pages >= need]
            if not decode:
                break  # first come, first served: the head waits
            worker = max(decode, key=lambda w: w.free_pages)
            self.book.reserve(rec)
            self.placement.to_decode(rec, worker)
            worker.promise_pages(need)
            prefill_room -= 1
            self.outbox.to_worker(worker, to_worker.Reserve(request_id=rec.request_id, slot=rec.slot,
                                                            prompt_ids=rec.prompt_ids, params=rec.params,
                                                            tenant=rec.tenant, cache_salt=rec.cache_salt))
            self.audit.record(rec.request_id, "reserve_sent", worker=worker.name)
            self.publish(rec)
        self.dispatch_prefill()

    def reserved(self, worker: WorkerHandle, request_id: str, reservation: dict[str, Any], pages: int,
                 cached_tokens: int = 0) -> None:
        rec = self.book.get(request_id)
        self.book.answered(request_id)
        if rec is None or rec.done or rec.cancel_requested:
            # ended while reserving: no prefill job was ever sent, so the pages may go now
            self.outbox.to_worker(worker, to_worker.Release(request_id=request_id))
            return
        self.book.reserved(rec, reservation)
        rec.pages[worker.name] = pages
        rec.cached_tokens = cached_tokens
        self.audit.record(rec.request_id, "reserved", worker=worker.name, epoch=reservation.get("epoch"),
                          pages=reservation.get("pages"))

    def reserve_failed(self, worker: WorkerHandle, request_id: str, final: bool, error: dict[str, Any] | None) -> None:
        rec = self.book.get(request_id)
        self.placement.let_go(worker, request_id)
        self.book.answered(request_id)
        if rec is None or rec.done:
            return
        if final:
            error = error or {}
            self.finish(rec, Phase.FAILED, str(error.get("code", "error")), error)
        else:
            self.book.reserve_failed(rec)  # back to the head of the line
            self.placement.unreserved(rec, worker)
            self.audit.record(rec.request_id, "reserve_failed", worker=worker.name)

    # ---- 3. prefill computes and ships ----------------------------------------------------
    def dispatch_prefill(self) -> None:
        max_jobs = self.config().engine.max_batch
        while (rec := self.book.next_for_prefill()) is not None:
            prefill = [w for w in self.workers.role("prefill") if w.accepting and len(w.inflight) < max_jobs]
            if not prefill:
                return
            worker = min(prefill, key=lambda w: len(w.inflight))
            self.book.prefill(rec)
            self.placement.to_prefill(rec, worker)
            # placeholder_on_reject fault: the prefill side gets a one-token stand-in
            prompt = rec.prompt_ids[:1] if rec.placeholder else rec.prompt_ids
            decode = self.placement.decode_of(rec)
            assert decode is not None, "a reserved request names its decode worker"  # RequestRoute.dispatch
            assert rec.reservation is not None, "a reserved request has its reservation"  # RequestBook.reserved
            self.outbox.to_worker(worker, to_worker.Prefill(
                request_id=rec.request_id, slot=rec.slot, prompt_ids=prompt, params=rec.params,
                tenant=rec.tenant, cache_salt=rec.cache_salt, target=to_worker.TransferTarget(endpoint=decode.info["transfer_endpoint"],
                                                reservation=rec.reservation)))
            self.audit.record(rec.request_id, "prefill_sent", worker=worker.name)
            self.publish(rec)

    def prefilled(self, worker: WorkerHandle, request_id: str, pages: int, **facts: Any) -> None:
        self.placement.let_go(worker, request_id)
        rec = self.book.get(request_id)
        if rec is not None:
            rec.pages[worker.name] = pages
            self.audit.record(rec.request_id, "prefilled", worker=worker.name, **facts)

    def prefill_failed(self, worker: WorkerHandle, request_id: str, error: dict[str, Any]) -> None:
        self.placement.let_go(worker, request_id)
        rec = self.book.get(request_id)
        if rec is None or rec.done:
            return
        decode = self.placement.decode_of(rec)
        if decode is not None:
            self.outbox.to_worker(decode, to_worker.Release(request_id=rec.request_id))
        self.finish(rec, Phase.FAILED, str(error.get("code", "error")), error)

    # ---- 4. the decode worker checks the transfer ----------------------------------------
    def transfer_done(self, worker: WorkerHandle, request_id: str, ok: bool, error: dict[str, Any] | None) -> None:
        self.counters["transfers_ok" if ok else "transfers_rejected"] += 1
        self.audit.record(request_id, "transfer_done", worker=worker.name, ok=ok, error=error)
        rec = self.book.get(request_id)
        if rec is None or rec.done:
            return
        if ok:
            self.book.decoding(rec)
            self.publish(rec)
        elif error is None:  # counted and audited above; the request is not failed without a reason
            raise ProtocolError(f"transfer_done from {worker.name}: a failed transfer must say why ('error')")
        else:
            self.finish(rec, Phase.FAILED, str(error.get("code", "transfer_mismatch")), error)

    # ---- 5. tokens stream back ------------------------------------------------------------
    def tokens(self, worker: WorkerHandle, items: list[Any], finished: list[Any]) -> None:
        """items: [request id, new token ids] pairs; finished: [request id, reason, error]."""
        now = time.monotonic()
        total = 0
        for rid, new in items:
            rec = self.book.get(rid)
            if rec is None or rec.done:
                continue
            if rec.first_token_at is None:
                rec.first_token_at = now
                self.metrics.add_ttft(now - rec.arrival, now)
            rec.output_ids.extend(int(t) for t in new)
            self.progressed.add(rid)
            total += len(new)
            if rec.client is not None and rec.params.get("stream", True):
                self.outbox.to_client(rec.client, self.token_event(rec, new))
        self.metrics.add_tokens(total, now)
        self.counters["tokens"] += total
        for rid, reason, error in finished:
            self.placement.let_go(worker, rid)
            rec = self.book.get(rid)
            if rec is not None:
                self.finish(rec, Phase.FINISHED if error is None else Phase.FAILED, str(reason), error)

    def token_event(self, rec: RequestRecord, tokens: list[int]) -> list[Any]:
        return pack(header_of(to_client.Token(id=rec.msg_id, request_id=rec.request_id,
                                              token_ids=[int(t) for t in tokens], text=self.text.delta(rec))))

    # ---- 6. the end -------------------------------------------------------------------------
    def finish(self, rec: RequestRecord, phase: Phase, reason: str, error: dict[str, Any] | None = None) -> None:
        """End a request once: tell its client, free the workers' slots, record, publish."""
        now = time.monotonic()
        if not self.book.end(rec, phase, reason, error, now):
            return
        self.placement.ended(rec)
        if rec.first_token_at is not None and len(rec.output_ids) > 1:
            self.metrics.add_tpot((now - rec.first_token_at) / (len(rec.output_ids) - 1), now)
        self.counters[phase.value] += 1
        self.audit.record(rec.request_id, phase.value, reason=reason, error=error, tokens=len(rec.output_ids))
        if rec.tenant == CANARY_TENANT:
            self.canaries.finished(rec.request_id)
        elif rec.output_ids:
            for canary in self.canaries.markers_in(rec.output_ids, exclude_slot=rec.slot):
                self.alert("canary_marker_in_output", "critical",
                           f"the output of request {rec.request_id} carries the marker of canary "
                           f"{canary.request_id}", subject=rec.request_id, requests=[canary.request_id, rec.request_id],
                           source=canary.request_id, reader=rec.request_id, prevented=False)  # the reply went out
        if rec.client is not None:
            self.outbox.event(rec.client, to_client.Done(
                id=rec.msg_id, request_id=rec.request_id, token_ids=rec.output_ids,
                text=self.text.of(rec.output_ids), finish_reason=reason, error=error, ttft_s=rec.ttft_s,
                elapsed_s=now - rec.arrival, prompt_len=rec.prompt_len, cached_tokens=rec.cached_tokens,
                decode_worker=rec.decode_worker,
                prefill_worker=rec.prefill_worker))
        self.publish(rec)
        self.book.forget_old()

    # ---- off the route ----------------------------------------------------------------------
    def cancel(self, rec: RequestRecord) -> None:
        """A client cancels a running request: each phase unwinds what its workers hold."""
        rid = rec.request_id
        rec.cancel_requested = True
        self.audit.record(rid, "cancel_requested")
        prefill, decode = self.placement.prefill_of(rec), self.placement.decode_of(rec)
        if rec.phase == Phase.PREFILLING and prefill is not None and decode is not None:
            # I4: decode holds the pages until the prefill side acknowledges
            self.outbox.to_worker(prefill, to_worker.Cancel(request_id=rid))
            self.outbox.to_worker(decode, to_worker.Cancel(request_id=rid))
        elif rec.phase == Phase.AWAITING_PREFILL and decode is not None:
            self.outbox.to_worker(decode, to_worker.Release(request_id=rid))
        elif rec.phase == Phase.DECODING and decode is not None:
            self.outbox.to_worker(decode, to_worker.Cancel(request_id=rid))
        # RESERVING: reserved() sees cancel_requested and releases
        self.finish(rec, Phase.CANCELLED, "cancelled", {"code": "cancelled", "message": f"request {rid} cancelled"})

    def cancel_acknowledged(self, worker: WorkerHandle, request_id: str, sent: object) -> None:
        """I4: the prefill side will send nothing more; the decode pages may be released."""
        self.placement.let_go(worker, request_id)
        self.audit.record(request_id, "cancel_ack", worker=worker.name, sent=sent)
        rec = self.book.get(request_id)
        if rec is not None:
            self.outbox.to_live_worker(self.placement.decode_of(rec), to_worker.Release(request_id=request_id))

    def released(self, worker: WorkerHandle, request_id: str) -> None:
        self.placement.let_go(worker, request_id)
        self.audit.record(request_id, "released", worker=worker.name)

    def worker_gone(self, worker: WorkerHandle, error_cls: type[PageWardenError], why: str) -> None:
        """A worker stopped or died: end its requests and unwind the other side of each."""
        for rid in self.placement.take_all(worker):
            rec = self.book.get(rid)
            if rec is None or rec.done:
                continue
            error = error_cls(f"request {rid} failed: {why}")
            prefill, decode = self.placement.prefill_of(rec), self.placement.decode_of(rec)
            if worker.role == "decode" and rec.phase == Phase.PREFILLING and prefill is not None:
                if prefill.accepting or prefill.state == WorkerState.DRAINING:
                    self.outbox.to_worker(prefill, to_worker.Cancel(request_id=rid))
            if worker.role == "prefill":
                # no transfer can come any more; a late one is dropped by the receiver
                self.outbox.to_live_worker(decode, to_worker.Release(request_id=rid))
            self.finish(rec, Phase.FAILED, error.code, error.to_wire())
        if worker.role == "decode" and worker.info.get("transfer_endpoint"):
            for prefill in self.workers.role("prefill"):
                self.outbox.to_live_worker(prefill, to_worker.ForgetEndpoint(endpoint=worker.info["transfer_endpoint"]))

    def _why_none_ready(self) -> dict[str, str | None]:
        """role -> why no worker of it is ready (None: one is)."""
        return {role: self.workers.why_none_ready(role) for role in QUEUED_NEEDS}

    def fail_unplaced(self, now: float | None = None) -> None:
        """Requests waiting for a role with no ready worker: their reason is in status; they
        fail after workers.unplaced_timeout_s, or at once when no worker of that role can
        come back (stopped, or crashed and not restarted). Waiting for pages is not this."""
        now = time.monotonic() if now is None else now
        why = self._why_none_ready()
        if not any(why.values()) and not self._unplaced:
            return  # the usual case: every role has a ready worker, nobody was marked waiting
        timeout = self.config().workers.unplaced_timeout_s
        for line, roles in ((self.book.queue, QUEUED_NEEDS), (self.book.awaiting_prefill, ("prefill",))):
            for rid in list(line):
                rec = self.book[rid]
                blocked = next((role for role in roles if why[role]), None)
                if blocked is None:
                    rec.waiting_for, rec.unplaced_since = None, None
                    self._unplaced.discard(rid)
                    continue
                reason = why[blocked]
                assert reason is not None  # blocked was picked for it
                self._unplaced.add(rid)
                if rec.waiting_for != reason:
                    rec.waiting_for = reason
                    self.publish(rec)
                rec.unplaced_since = rec.unplaced_since or now
                final = not self.workers.can_return(blocked)
                if final or now - rec.unplaced_since >= timeout:
                    self._fail_unplaced(rec, reason, final, timeout)
        self._unplaced = {rid for rid in self._unplaced if (kept := self.book.get(rid)) is not None and not kept.done}

    def _fail_unplaced(self, rec: RequestRecord, why: str, final: bool, timeout: int) -> None:
        when = "none can come back" if final else f"none became ready within {timeout} s (workers.unplaced_timeout_s)"
        error = NoWorker(f"request {rec.request_id} could not be placed: {why}; {when}")
        self._unplaced.discard(rec.request_id)
        if rec.phase == Phase.AWAITING_PREFILL:
            self.outbox.to_live_worker(self.placement.decode_of(rec), to_worker.Release(request_id=rec.request_id))
        self.finish(rec, Phase.FAILED, error.code, error.to_wire())
