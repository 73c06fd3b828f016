"""DecodeWorker: reserves pages, accepts verified KV transfers, decodes in batches.

I3: pages of a reservation become WRITTEN only when a transfer matching it arrived whole
(TransferReceiver checks request, epoch, token and page counts, page ids and checksums).
I4: a cancelled reservation keeps its pages IN_FLIGHT until the supervisor says the
prefill side acknowledged the cancellation; a transfer arriving after that is dropped.
"""

from __future__ import annotations

import time

import msgspec
import numpy as np
import zmq

from engine.errors import Cancelled, PoolExhausted, TransferMismatch, TransferTimeout
from engine.request import Request, RequestOutput
from engine.wire.messages import to_supervisor as report
from engine.wire.messages import to_worker as command
from engine.wire.page_tags import PageState
from engine.wire.sockets import drain, harden
from engine.workers.loop import WorkerLoop
from engine.workers.prefill import params_from_wire
from engine.workers.transfer.manifest import Reservation
from engine.workers.transfer.receive import TransferReceiver

TRANSFER_TIMEOUT_S = 60.0


class DecodeWorker(WorkerLoop):
    role = "decode"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.kv = harden(self.ctx.socket(zmq.PULL), "kv")
        self.kv_endpoint = f"ipc://{self.run_dir}/{self.name}.kv"
        self.kv.bind(self.kv_endpoint)
        self.poller.register(self.kv, zmq.POLLIN)
        self.receiver = TransferReceiver(self.engine.pool)
        self.reserved: dict[str, Request] = {}  # waiting for their transfer
        self.swapped: dict[str, int] = {}  # stale_block_table fault: the page each table lost
        self.cancelling: set[str] = set()  # cancelled; pages held until the prefill side acks
        self._epochs = 0
        self._last_expire = time.monotonic()
        self.apply_guard(self.engine.config)

    def apply_guard(self, config) -> None:
        super().apply_guard(config)
        self.receiver.verify_manifest = config.defences.manifest_check
        self.receiver.verify_ownership = config.defences.deferred_release
        self.faults = config.faults

    def hello(self) -> report.Hello:
        return msgspec.structs.replace(super().hello(), transfer_endpoint=self.kv_endpoint)

    def stats(self) -> dict:
        return {**super().stats(), "running": len(self.engine.scheduler.running),
                "reserved": len(self.reserved), "transfers": dict(self.receiver.counts)}

    def busy(self) -> bool:
        return bool(self.engine.scheduler.running)

    def _periodic(self) -> None:
        self.engine.pool.release_quarantine()  # held evidence goes back, scrubbed, in time
        super()._periodic()

    # ---- commands ---------------------------------------------------------------------
    def on_reserve(self, cmd: command.Reserve) -> None:
        request = Request(cmd.request_id, cmd.prompt_ids, params_from_wire(cmd.params), tenant=cmd.tenant,
                          slot=cmd.slot, salt=self.engine.salt_for(cmd.tenant, cmd.cache_salt))
        pool = self.engine.pool
        limit = min(pool.capacity_tokens, self.engine.model.decoder.max_positions)
        if request.total_tokens > limit:
            # only reachable with admission off or faulty: it can never fit here, do not retry
            self.send(report.ReserveFailed(
                request_id=request.request_id, final=True, free_pages=pool.available_pages, error={
                    "code": "admission_rejected", "message": f"request {request.request_id} needs "
                    f"{request.total_tokens:,} tokens; decode pool {pool.name!r} and the model hold {limit:,}"}))
            return
        try:
            self.engine.reserve(request)
        except PoolExhausted as exc:
            self.send(report.ReserveFailed(request_id=request.request_id, error=exc.to_wire(),
                                           free_pages=pool.available_pages))
            return
        table = request.page_table
        # the leading pages its prefix cache holds stay out of the transfer
        first = request.cached_tokens // pool.page_size
        prompt_pages = table.pages[first: pool.pages_for_tokens(request.prompt_len)]
        pool.set_state(request.slot, prompt_pages, PageState.IN_FLIGHT)
        self._epochs += 1
        reservation = Reservation(
            request.request_id, request.slot, self._epochs, request.prompt_len,
            prompt_pages.astype(np.int32), table.epochs[first: first + len(prompt_pages)].astype(np.int64),
            first_page=first,
        )
        self.receiver.expect(reservation)
        self.reserved[request.request_id] = request
        self._inject_faults(request, prompt_pages)
        self.send(report.Reserved(request_id=request.request_id, reservation=reservation.to_wire(),
                                  endpoint=self.kv_endpoint, pages=len(table.own_pages()),
                                  free_pages=pool.available_pages, cached_tokens=request.cached_tokens))

    def _inject_faults(self, request: Request, prompt_pages) -> None:
        pool, table = self.engine.pool, request.page_table
        if self.faults.early_release:
            # the bug: the pages go back before the transfer arrives; the transfer still comes
            pool.release(request.slot, prompt_pages)
        if self.faults.stale_block_table and pool.free_pages:
            # the bug: the table's last entry names the page the pool hands out next
            self.swapped[request.request_id] = int(table.pages[-1])
            table.pages[-1] = pool.peek_free()

    def on_cancel(self, cmd: command.Cancel) -> None:
        request_id = cmd.request_id
        if request_id in self.reserved:
            # I4: stop accepting its transfer, but keep its pages until the prefill side acks.
            self.receiver.cancel(request_id)
            self.cancelling.add(request_id)
        else:
            self._fail(request_id, Cancelled(f"request {request_id} cancelled"))

    def on_release(self, cmd: command.Release) -> None:
        """The prefill side acknowledged (or died): the reservation's pages may go."""
        request_id = cmd.request_id
        self._return_swapped(request_id)
        self.cancelling.discard(request_id)
        if self.reserved.pop(request_id, None) is not None:
            self.receiver.cancel(request_id)
            self.engine.abort(request_id, Cancelled(f"request {request_id} released"))
        self.send(report.Released(request_id=request_id, free_pages=self.engine.pool.available_pages))

    # ---- transfers ------------------------------------------------------------------
    def on_ready(self, ready: dict) -> None:
        if self.kv not in ready:
            return
        for frames in drain(self.kv):
            event = self.receiver.on_message(frames)
            if event is not None:
                self._on_transfer(event)

    def _on_transfer(self, event) -> None:
        for note in self.receiver.take_notes():  # problems seen with a defence off
            kind = "transfer_mismatch" if note.kind == "mismatch_accepted" else note.kind
            self.alert(kind, "critical", note.detail, requests=[note.request_id], pages=note.pages,
                       prevented=False)
        rid = event.request_id
        if event.kind == "complete" and rid in self.reserved:
            self.engine.prompt_arrived(self.reserved.pop(rid))
            outputs = self.engine.adopt(rid, event.first_token)
            self.send(report.TransferDone(request_id=rid, ok=True))
            self._report(outputs)
        elif event.kind in ("mismatch", "timeout") and rid in self.reserved:
            error_cls = TransferMismatch if event.kind == "mismatch" else TransferTimeout
            error = error_cls(f"request {rid}: KV transfer rejected by {self.name}: {event.detail}; "
                              f"its pages were scrubbed and freed")
            self.alert(error.code, "critical", event.detail, requests=[rid], pages=event.pages, prevented=True)
            self._fail(rid, error)
            self.send(report.TransferDone(request_id=rid, ok=False, error=error.to_wire()))
        elif event.kind == "late":
            self.alert("late_write_dropped", "warning", event.detail,
                       requests=[rid] if rid else [], pages=event.pages, prevented=True)
        else:
            self.bad_messages += 1

    def _fail(self, request_id: str, error) -> None:
        self.reserved.pop(request_id, None)
        self.cancelling.discard(request_id)
        self.engine.abort(request_id, error)  # frees (and scrubs) its pages
        self._return_swapped(request_id)

    def _return_swapped(self, request_id: str) -> None:
        """stale_block_table: the page the table lost is still its request's; give it back."""
        page = self.swapped.pop(request_id, None)
        if page is not None and int(self.engine.pool.owner[page]) >= 0:
            self.engine.pool.release(int(self.engine.pool.owner[page]), [page])

    # ---- decoding ---------------------------------------------------------------------
    def work(self) -> None:
        now = time.monotonic()
        if now - self._last_expire > 1.0:
            self._last_expire = now
            for event in self.receiver.expire(now, TRANSFER_TIMEOUT_S):
                self._on_transfer(event)
        if self.engine.scheduler.running:
            self._report(self.engine.step())
            self.forward_events()

    def _report(self, outputs: list[RequestOutput]) -> None:
        if not outputs:
            return
        items = [(o.request_id, o.new_token_ids) for o in outputs if o.new_token_ids]
        finished = [(o.request_id, o.finish_reason, o.error.to_wire() if o.error else None)
                    for o in outputs if o.finished]
        self.send(report.Tokens(items=items, finished=finished, free_pages=self.engine.pool.available_pages))
        for rid, _, _ in finished:
            self._return_swapped(rid)

    def close(self) -> None:
        self.kv.close(linger=0)
        super().close()
