"""QueryOps: what a client may read (viewer ops): status, scope, the prompt log, history,
an audit, the ground truth of cross reads, page maps; and acknowledging alerts."""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

import msgpack

from engine.errors import Forbidden, InvalidRequest, PageWardenError
from engine.guard.read_log import ReadLog
from engine.server.alerts import AlertBook
from engine.server.audit import AuditLog
from engine.server.control_call import Call
from engine.server.evidence_feed import EvidenceFeed
from engine.server.outbox import Outbox
from engine.server.pending_asks import PendingAsks
from engine.server.request_book import RequestBook
from engine.server.telemetry import TelemetryPublisher
from engine.server.worker_pool import WorkerPool
from engine.wire.messages import control, to_worker
from engine.wire.protocol import ProtocolError
from engine.wire.states import WorkerState

if TYPE_CHECKING:
    from engine.server.supervisor import Supervisor

HISTORY_PAGE_BYTES = 16 << 20  # and about this many bytes: a page stops once it holds more


class ObservedEngine(Protocol):
    """What answering a viewer needs of the supervisor (status excepted: it shows everything)."""

    book: RequestBook
    reads: ReadLog
    audit: AuditLog
    alerts: AlertBook
    evidence: EvidenceFeed
    telemetry: TelemetryPublisher
    workers: WorkerPool
    asks: PendingAsks
    outbox: Outbox
    prompt_log: deque[dict[str, Any]]


class QueryOps:
    def __init__(self, engine: ObservedEngine, status: Supervisor):
        """status: the whole supervisor, which `status` describes."""
        self.engine, self._status = engine, status

    def ping(self, call: Call) -> None:
        call.read(control.Ping)
        call.reply({"pong": time.time()})

    def status(self, call: Call) -> None:
        """brief: leave out config and alerts (a window polling twice a second)."""
        from engine.server.status_report import status_report

        call.reply(status_report(self._status, self.crossings(), brief=call.read(control.Status).brief))

    def crossings(self) -> dict[str, Any]:
        """Data that crossed between requests, for the app's banner: how many distinct (source,
        reader) pairs so far, and the newest ones with their tenants."""
        reads = self.engine.reads
        recent = [self._with_tenants(p) for p in reads.recent_pairs]
        return {"pairs": reads.pair_count, "reads": reads.total, "recent": recent}

    def _with_tenants(self, pair: dict[str, Any]) -> dict[str, Any]:
        """A (source, reader) pair with the tenants of both requests (None: unknown by now)."""
        def tenant(rid: str | None) -> str | None:
            rec = self.engine.book.get(rid) if rid else None
            return rec.tenant if rec is not None else None

        return {**pair, "source_tenant": tenant(pair["source"]), "reader_tenant": tenant(pair["reader"])}

    def scope(self, call: Call) -> None:
        """Affected pairs in a time window (wall-clock seconds; default everything kept), with
        their tenants where the requests are still known."""
        engine, asked = self.engine, call.read(control.Scope)
        since, until, run = asked.since, asked.until, asked.run
        if run is not None and run != engine.evidence.run:  # an earlier run (or "all"): the journal knows
            def answer(result: Any) -> None:  # on the loop, once the journal's reader thread has it
                if isinstance(result, PageWardenError):
                    call.error(result.code, str(result))
                    return
                call.reply({"pairs": result, "reads": sum(p["reads"] for p in result), "since": since,
                            "until": until, "incomplete_before": None, "dropped_reads": 0, "run": run})

            engine.evidence.scope(since, until, run, answer)
            return
        reads = engine.reads
        pairs = [self._with_tenants(p) for p in reads.scope(since, until)]
        call.reply({"pairs": pairs, "reads": reads.total, "since": since, "until": until,
                    "incomplete_before": reads.incomplete_before(since), "dropped_reads": reads.dropped_reads})

    def prompt_log(self, call: Call) -> None:
        since = call.read(control.PromptLog).since
        log = self.engine.prompt_log
        entries = [e for e in log if e["time"] >= since]
        call.reply({"entries": entries[-10_000:], "total": len(entries), "left_out": max(0, len(entries) - 10_000),
                    "memory_limit": log.maxlen, "journal": self.engine.evidence.journal is not None})

    def history(self, call: Call) -> None:
        """What an incident snapshot needs of a time window (wall-clock seconds): the
        requests with their lifecycle events, and the telemetry published (bulk frames
        summarised). Prompts appear as length and hash only."""
        engine, asked = self.engine, call.read(control.History)
        since, after, limit = asked.since, asked.after, asked.limit
        requests: list[dict[str, Any]] = []
        other: list[dict[str, Any]] = []
        size, last, more = 0, after, None
        for subject, events, seq in engine.audit.since(since, after=after, limit=limit + 1):
            if len(requests) + len(other) >= limit or size >= HISTORY_PAGE_BYTES:
                more = last  # the page is full: the next one starts after the last subject in it
                break
            rec = engine.book.get(subject)
            item: dict[str, Any]
            if rec is not None:
                item = {**rec.describe(), "events": events}
                requests.append(item)
            elif events[0]["event"] in ("rejected", "admitted", "placeholder"):
                phase = "rejected" if events[0]["event"] == "rejected" else "forgotten"
                item = {"request_id": subject, "phase": phase, "events": events, "arrival": events[0]["time"]}
                requests.append(item)
            else:
                item = {"subject": subject, "events": events}
                other.append(item)
            size += len(msgpack.packb(item, use_bin_type=True))
            last = seq
        # the first page also carries the first page-map keyframes of the window (the journal's)
        frames, frames_left_out = engine.evidence.keyframes(since) if not after else ([], 0)
        # the telemetry kept comes with the first page; `next` asks for the page after this one
        call.reply({"since": since, "until": time.time(), "requests": requests, "engine_events": other,
                    "next": more, "telemetry": engine.telemetry.since(since) if not after else [],
                    "keyframes": frames, "keyframes_left_out": frames_left_out,
                    # older requests left memory (the journal keeps them): a window that starts
                    # before forgotten_until is partial here
                    "audit_kept": engine.audit.max_requests, "audit_forgotten": engine.audit.forgotten,
                    "audit_forgotten_until": engine.audit.forgotten_until})

    def ground_truth(self, call: Call) -> None:
        """Every worker's own list of the cross-request reads it saw happen (a prefill worker's
        too: a prefill attends the cached prefix it took from its pool)."""
        call.read(control.GroundTruth)
        workers = [w for w in self.engine.workers.values() if w.state == WorkerState.READY]
        self.engine.asks.cross_reads(workers, call.identity, call.msg_id)

    def ack_alert(self, call: Call) -> None:
        ids = [str(i) for i in call.read(control.AckAlert).ids]
        call.reply({"acknowledged": self.engine.alerts.acknowledge(ids)})

    def audit(self, call: Call) -> None:
        rid = call.read(control.Audit).request_id
        rec = self.engine.book.get(rid)
        if rec is not None:
            call.own(rec, "read the audit of")
        elif call.role != "admin":
            raise Forbidden(f"request {rid!r} is not tracked; only an admin may read an untracked audit")
        call.reply({"request_id": rid, "events": self.engine.audit.events(rid),
                    "request": rec.describe() if rec else None})

    def keyframe(self, call: Call) -> None:
        call.read(control.Keyframe)
        self.engine.outbox.broadcast(to_worker.Keyframe())
        pools = [w.info["pool"]["name"] for w in self.engine.workers.values() if w.state == WorkerState.READY]
        call.reply({"pools": pools})

    def page_metadata(self, call: Call) -> None:
        pool = call.read(control.PageMetadata).pool
        if pool is None:
            raise ProtocolError("field 'pool' is required: the name of a pool (status lists them)")
        for worker in self.engine.workers.values():
            if worker.state == WorkerState.READY and worker.info.get("pool", {}).get("name") == pool:
                self.engine.asks.page_metadata(worker, call.identity, call.msg_id)
                return
        raise InvalidRequest(f"no ready worker owns pool {pool!r}")
