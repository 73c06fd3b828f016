"""WorkerEvents: what the supervisor does with each message a worker sends on the bus."""

from __future__ import annotations

import time

from engine.server.reconfigure import worker_ready
from engine.server.worker_handle import WorkerHandle
from engine.wire.bus_ops import TO_SUPERVISOR
from engine.wire.protocol import Message, ProtocolError, field_of
from engine.wire.states import Phase, WorkerState


class WorkerEvents:
    def __init__(self, sup):
        self.sup = sup

    def handle(self, identity: bytes, msg: Message | None, frames: list) -> None:
        sup = self.sup
        worker = sup.workers.get(identity.decode(errors="replace"))
        if msg is None or worker is None:
            raise ProtocolError(f"bus message from unknown peer {identity[:32]!r}")
        if msg.op == "hello":
            return self.on_hello(worker, msg)
        if worker.state not in (WorkerState.READY, WorkerState.DRAINING, WorkerState.STOPPING):
            raise ProtocolError(f"worker {worker.name} spoke before a valid hello")
        worker.last_seen = time.monotonic()
        handler = getattr(self, f"on_{msg.op}", None) if msg.op in TO_SUPERVISOR else None
        if handler is None:
            raise ProtocolError(f"unknown worker op {msg.op!r} from {worker.name}")
        if msg.op == "pages":
            return self.on_pages(worker, msg, frames)
        handler(worker, msg)

    # ---- lifecycle ------------------------------------------------------------------
    def on_hello(self, worker: WorkerHandle, msg: Message) -> None:
        sup = self.sup
        if worker.state != WorkerState.STARTING or field_of(msg, "token", "str") != worker.token:
            raise ProtocolError(f"hello from {worker.name} refused: not expected or wrong token")
        sup.workers.hello(worker, {k: v for k, v in msg.header.items() if k != "token"})
        sup.audit_worker(worker, "ready")
        worker_ready(sup, worker.name)
        sup.alerts.resolve("worker_crashed", worker.name)
        fallback = msg.header.get("kernels_fallback")
        if isinstance(fallback, str) and fallback:
            sup.alert("slow_kernels", "warning",
                      f"worker {worker.name} computes with the torch reference kernels, several times slower: the "
                      f"CPU module could not be built ({fallback[:300]})", subject=worker.name)
        else:
            sup.alerts.resolve("slow_kernels", worker.name)
        sup.to_worker(worker, {"op": "telemetry", "pages": sup.telemetry.wants_pages()})
        sup.publish_workers()

    def on_heartbeat(self, worker: WorkerHandle, msg: Message) -> None:
        worker.stats = {k: v for k, v in msg.header.items() if k not in ("op", "v")}
        self.sup.alerts.resolve("worker_unresponsive", worker.name)

    def on_bad_command(self, worker: WorkerHandle, msg: Message) -> None:
        self.sup.counters["worker_bad_commands"] += 1

    # ---- request flow -----------------------------------------------------------------
    def _record(self, msg: Message):
        return self.sup.book.get(field_of(msg, "request_id", "str"))

    def on_reserved(self, worker: WorkerHandle, msg: Message) -> None:
        sup, rec = self.sup, self._record(msg)
        worker.stats["free_pages"] = field_of(msg, "free_pages", "int")
        sup.book.answered(field_of(msg, "request_id", "str"))
        if rec is None or rec.done or rec.cancel_requested:
            # ended while reserving: no prefill job was ever sent, so the pages may go now
            sup.to_worker(worker, {"op": "release", "request_id": field_of(msg, "request_id", "str")})
            return
        sup.book.reserved(rec, field_of(msg, "reservation", "map"))
        rec.pages[worker.name] = field_of(msg, "pages", "int")
        sup.audit.record(rec.request_id, "reserved", worker=worker.name, epoch=rec.reservation.get("epoch"),
                         pages=rec.reservation.get("pages"))

    def on_reserve_failed(self, worker: WorkerHandle, msg: Message) -> None:
        sup, rec = self.sup, self._record(msg)
        worker.stats["free_pages"] = field_of(msg, "free_pages", "int")
        worker.inflight.discard(field_of(msg, "request_id", "str"))
        sup.book.answered(field_of(msg, "request_id", "str"))
        if rec is not None and not rec.done and msg.get("final"):
            error = field_of(msg, "error", "map")
            sup.finish(rec, Phase.FAILED, str(error.get("code", "error")), error)
        elif rec is not None and not rec.done:
            sup.book.reserve_failed(rec)  # back to the head of the line
            sup.audit.record(rec.request_id, "reserve_failed", worker=worker.name)

    def on_prefilled(self, worker: WorkerHandle, msg: Message) -> None:
        rec = self._record(msg)
        worker.inflight.discard(field_of(msg, "request_id", "str"))
        if rec is not None:
            rec.pages[worker.name] = field_of(msg, "pages", "int")
            self.sup.audit.record(rec.request_id, "prefilled", worker=worker.name,
                                  chunks=msg.get("chunks"), elapsed_s=msg.get("elapsed_s"))

    def on_prefill_failed(self, worker: WorkerHandle, msg: Message) -> None:
        sup, rec = self.sup, self._record(msg)
        worker.inflight.discard(field_of(msg, "request_id", "str"))
        if rec is None or rec.done:
            return
        if rec.decode_worker:
            sup.to_worker(sup.workers[rec.decode_worker], {"op": "release", "request_id": rec.request_id})
        error = field_of(msg, "error", "map")
        sup.finish(rec, Phase.FAILED, str(error.get("code", "error")), error)

    def on_transfer_done(self, worker: WorkerHandle, msg: Message) -> None:
        sup, rec = self.sup, self._record(msg)
        ok = field_of(msg, "ok", "bool")
        rid = field_of(msg, "request_id", "str")
        sup.counters["transfers_ok" if ok else "transfers_rejected"] += 1
        sup.audit.record(rid, "transfer_done", worker=worker.name, ok=ok, error=msg.get("error"))
        if rec is None or rec.done:
            return
        if ok:
            sup.book.decoding(rec)
            sup.publish_request(rec)
        else:
            error = field_of(msg, "error", "map")
            sup.finish(rec, Phase.FAILED, str(error.get("code", "transfer_mismatch")), error)

    def on_tokens(self, worker: WorkerHandle, msg: Message) -> None:
        sup = self.sup
        now = time.monotonic()
        worker.stats["free_pages"] = field_of(msg, "free_pages", "int")
        total = 0
        for item in field_of(msg, "items", "list"):
            rid, tokens = item
            rec = sup.book.get(rid)
            if rec is None or rec.done:
                continue
            if rec.first_token_at is None:
                rec.first_token_at = now
                sup.metrics.add_ttft(rec.ttft_s, now)
                sup.progressed.add(rid)
            rec.output_ids.extend(int(t) for t in tokens)
            sup.progressed.add(rid)
            total += len(tokens)
            if rec.client is not None and rec.params.get("stream", True):
                sup.to_client(rec.client, sup.ops.token_event(rec, tokens))
        sup.metrics.add_tokens(total, now)
        sup.counters["tokens"] += total
        for rid, reason, error in field_of(msg, "finished", "list"):
            rec = sup.book.get(rid)
            worker.inflight.discard(rid)
            if rec is not None:
                phase = Phase.FINISHED if error is None else Phase.FAILED
                sup.finish(rec, phase, str(reason), error)

    def on_cancel_ack(self, worker: WorkerHandle, msg: Message) -> None:
        """I4: the prefill side will send nothing more; the decode pages may be released."""
        sup, rec = self.sup, self._record(msg)
        rid = field_of(msg, "request_id", "str")
        worker.inflight.discard(rid)
        sup.audit.record(rid, "cancel_ack", worker=worker.name, sent=msg.get("sent"))
        if rec is not None and rec.decode_worker:
            decode = sup.workers[rec.decode_worker]
            if sup.workers.alive(decode):
                sup.to_worker(decode, {"op": "release", "request_id": rid})

    def on_released(self, worker: WorkerHandle, msg: Message) -> None:
        worker.stats["free_pages"] = field_of(msg, "free_pages", "int")
        rid = field_of(msg, "request_id", "str")
        worker.inflight.discard(rid)
        self.sup.audit.record(rid, "released", worker=worker.name)

    # ---- telemetry ------------------------------------------------------------------
    def on_pages(self, worker: WorkerHandle, msg: Message, frames: list) -> None:
        self.sup.telemetry.relay_pages(msg.header, msg.arrays)

    def on_alert(self, worker: WorkerHandle, msg: Message) -> None:
        fields = {k: v for k, v in msg.header.items() if k not in ("op", "v", "kind", "severity", "detail")}
        fields.setdefault("pool", worker.info.get("pool", {}).get("name", worker.name))
        self.sup.alert(str(msg.get("kind")), str(msg.get("severity", "warning")), str(msg.get("detail", "")),
                       subject=str(fields["pool"]), **fields)

    # ---- the isolation guard -------------------------------------------------------------
    def on_isolation(self, worker: WorkerHandle, msg: Message) -> None:
        """I1 detections and cross-request reads (ground truth) from a worker's last steps."""
        sup = self.sup
        for event in field_of(msg, "events", "list", max_len=100_000):
            if not isinstance(event, dict):
                continue
            if event.get("kind") == "ownership_violation":
                self._ownership(worker, event)
            elif event.get("kind") == "cross_read":
                self._cross_read(worker, event)
        sup.counters["isolation_events"] += 1

    def _request_of(self, slot) -> str | None:
        return self.sup.book.slot_owner(int(slot)) if isinstance(slot, int) else None

    def _ownership(self, worker: WorkerHandle, event: dict) -> None:
        sup = self.sup
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
        sup.audit.record(reader, "ownership_violation", pages=pages, prevented=prevented,
                         foreign_slots=event.get("foreign_slots"), unwritten_slots=event.get("unwritten_slots"),
                         stale_pages=event.get("stale_pages"))
        sup.alert("ownership_violation", "critical", detail, subject=str(event.get("pool")),
                  requests=[reader, *[s for s in sources if not s.startswith("slot")]],
                  pages=[p["page"] for p in pages], prevented=prevented, reader=reader, pool=str(event.get("pool")))
        for writer in writers:
            if sup.canaries.is_canary_slot(writer) and not sup.canaries.is_canary_slot(event.get("slot")):
                self._canary_leak(sup.canaries.by_slot[writer].request_id, reader,
                                  [p["page"] for p in pages if writer in _writer_slots(p)], prevented)

    def _cross_read(self, worker: WorkerHandle, event: dict) -> None:
        from engine.guard.read_log import ReadRecord

        sup = self.sup
        reader, slot = str(event.get("request")), int(event.get("slot", -1))
        when = float(event.get("time", time.time()))
        canary_pages: dict[int, list[int]] = {}
        for page, source in event.get("reads") or []:
            sup.reads.add(ReadRecord(when, reader, slot, self._request_of(source), int(source),
                                     str(event.get("pool")), int(page)))
            if sup.canaries.is_canary_slot(source) and not sup.canaries.is_canary_slot(slot):
                canary_pages.setdefault(int(source), []).append(int(page))
        sup.counters["cross_reads"] += len(event.get("reads") or [])
        sup.audit.record(reader, "cross_read", reads=event.get("reads"), pool=event.get("pool"))
        for source, pages in canary_pages.items():
            self._canary_leak(sup.canaries.by_slot[source].request_id, reader, pages, False)

    def _canary_leak(self, canary: str, reader: str, pages: list[int], prevented: bool) -> None:
        how = "the read was masked" if prevented else "the data WAS read"
        self.sup.alert("canary_leak", "critical", f"request {reader} touched pages written by canary {canary} ({how})",
                       subject=reader, requests=[canary, reader], pages=pages, prevented=prevented,
                       source=canary, reader=reader)

    def on_cross_reads(self, worker: WorkerHandle, msg: Message) -> None:
        pending = self.sup.pending_truth.get(msg.get("ask_id"))
        if pending is None:
            return
        for read in msg.get("reads") or []:
            pending["reads"].append({**read, "worker": worker.name})
        pending["waiting"].discard(worker.name)
        if not pending["waiting"]:
            self.finish_truth(msg.get("ask_id"))

    def finish_truth(self, ask_id) -> None:
        from engine.wire.protocol import pack

        pending = self.sup.pending_truth.pop(ask_id)
        for read in pending["reads"]:
            read["reader"] = read.get("request")
            read["source"] = self._request_of(read.get("source_slot"))
        self.sup.to_client(pending["client"], pack({"op": "reply", "id": pending["id"],
                                                    "result": {"reads": pending["reads"]}}))

    def on_page_metadata(self, worker: WorkerHandle, msg: Message) -> None:
        from engine.wire.protocol import pack

        waiting = self.sup.pending_metadata.pop(msg.get("ask_id"), None)
        if waiting is not None and waiting[0] is None:  # the supervisor's own ask: a journal keyframe
            self.sup.evidence.keyframe(msg.get("pool") or worker.name, msg.arrays, reason=waiting[1])
        elif waiting is not None:
            client, msg_id = waiting
            self.sup.to_client(client, pack({"op": "reply", "id": msg_id, "result": {
                "pool": msg.get("pool"), "worker": worker.name}}, msg.arrays))


def _writer_slots(page: dict) -> list[int]:
    """The slots that wrote a page's failing token slots, from a worker's report (`writers`,
    or the older single `writer`): none when nobody did (`writer: null`) or a field is not the
    expected [slot, epoch] pair."""
    writers = page.get("writers")
    if not isinstance(writers, list):
        writers = [page.get("writer")]
    return [w[0] for w in writers if isinstance(w, (list, tuple)) and w and isinstance(w[0], int)]
