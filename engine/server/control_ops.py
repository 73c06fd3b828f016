"""ControlOps: the supervisor's answers to clients (submit, status, worker control, ...)."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field

import msgpack
import zmq

from engine import __version__
from engine.admission import check_admission, check_prompt_ids
from engine.errors import AdmissionRejected, Forbidden, InvalidRequest, PageWardenError
from engine.request import SamplingParams
from engine.server.alert_forward import shown_changes, shown_config
from engine.server.prompt_text import TokenizeJob, check_prompt_bytes
from engine.server.reconfigure import reconfigure
from engine.server.request_record import RequestRecord
from engine.wire.protocol import (
    CANARY_PREFIX,
    CANARY_TENANT,
    MAX_CONTROL_FRAME,
    Message,
    ProtocolError,
    error_reply,
    field_of,
    pack,
    reply,
)
from engine.wire.roles import CLIENT_OPS, OP_ROLES, allows
from engine.wire.states import Phase, WorkerState

MAX_PROMPT_TOKENS = 1 << 21
# Settings a worker applies between steps; anything else in [engine] or [pools] restarts it.


HISTORY_PAGE_SUBJECTS = 2_000  # requests (and engine subjects) in one `history` answer, at most
HISTORY_PAGE_BYTES = 16 << 20  # and about this many bytes: a page stops once it holds more


@dataclass
class _Submit:
    """One submit's fields, carried from its message to its admission (later, for a text prompt)."""

    identity: bytes
    msg: Message
    slot: int
    request_id: str
    caller: str
    tenant: str
    tier: str | None
    sub_client: str
    params: dict = field(default_factory=dict)


class ControlOps:
    def __init__(self, sup):
        self.sup = sup

    def handle(self, identity: bytes, msg: Message | None, frames: list) -> None:
        if msg is None:
            raise ProtocolError("empty message")
        op = msg.op
        if op not in CLIENT_OPS:
            raise ProtocolError(f"unknown op {op!r}; known: {', '.join(CLIENT_OPS)}")
        self.caller, self.role = self._caller(identity, frames)
        if not allows(self.role, op):
            self.sup.counters["forbidden"] += 1
            raise Forbidden(f"op {op!r} needs the {OP_ROLES[op]} role; this client is a {self.role}")
        self.sup.counters[f"op:{op}"] += 1
        getattr(self, f"op_{op}")(identity, msg)

    def _caller(self, identity: bytes, frames: list) -> tuple[str, str]:
        """(who, role) of the sender: its CURVE key and the role the allowlist gives it, or,
        without CURVE (loopback only), its connection and serve --local-role. Loopback clients
        share a role but not their requests: each connection owns what it submitted, as each
        has its own budget (a connection's ROUTER identity is the server's to give and stays
        its own while it is connected)."""
        sup = self.sup
        if sup.curve is None:
            return f"local:{identity.hex()}", sup.local_role
        try:
            user = frames[0].get("User-Id") if frames else None
        except (zmq.ZMQError, AttributeError, TypeError):
            user = None
        role = sup.curve.role_of(user)
        if role is None:
            raise Forbidden("this client's key is not in the allowlist any more (it was removed after it connected)")
        return user, role  # type: ignore[return-value]  # role_of() gives None without a User-Id

    def _own(self, rec: RequestRecord, what: str) -> None:
        """Only the client that submitted a request (or an admin) may act on it."""
        if rec.owner != self.caller and self.role != "admin":
            self.sup.counters["forbidden"] += 1
            raise Forbidden(f"request {rec.request_id} belongs to another client; only it or an admin may {what} it")

    def _reply(self, identity: bytes, msg: Message, result: dict | None = None, arrays=None) -> None:
        frames = reply(msg.get("id"), result, arrays)
        size = max(len(f) for f in frames)
        if size > MAX_CONTROL_FRAME:  # the client would drop it unseen and wait for its timeout
            self.sup.counters["answers_too_large"] += 1
            frames = error_reply(msg.get("id"), "answer_too_large",
                                 f"the answer to {msg.get('op')!r} would be {size:,} bytes in one frame; the limit is "
                                 f"{MAX_CONTROL_FRAME:,}: ask for a shorter window or page through it")
        self.sup.to_client(identity, frames)

    # ---- requests ---------------------------------------------------------------------
    def op_submit(self, identity: bytes, msg: Message) -> None:
        """A text prompt is checked against its byte limit, then tokenized beside the loop
        (engine/server/prompt_text.py); its admission continues in _tokenized. Token ids go
        to admission at once."""
        sup = self.sup
        slot = next(sup.slots)
        request_id = field_of(msg, "request_id", "str", default=f"r{slot}", max_len=128)
        request = _Submit(identity, msg, slot, request_id, caller=self.caller,
                          tenant=field_of(msg, "tenant", "str", default="default", max_len=64),
                          tier=field_of(msg, "data_tier", "str", default=None, max_len=64),
                          # the client behind this connection (the HTTP front names its peer): a turn of its
                          # own in the queue, within this connection's turn, so naming more of them gains nothing
                          sub_client=field_of(msg, "client", "str", default="", max_len=128))
        try:
            request.params = self._params(msg)
            ids = field_of(msg, "prompt_ids", "list[int]", default=None, max_len=MAX_PROMPT_TOKENS)
            text = field_of(msg, "prompt", "str", default=None, max_len=8 * MAX_PROMPT_TOKENS)
            if (ids is None) == (text is None):
                raise InvalidRequest(f"request {request_id}: give exactly one of 'prompt_ids' and 'prompt'")
            self._check_new_id(request_id)
            if text is not None:
                size = len(text.encode("utf-8", "surrogatepass"))
                check_prompt_bytes(request_id, size, sup.config.engine.context_window)
                sup.prompts.submit(TokenizeJob(request_id, text, size, self.caller, sup.tokenizer.encode,
                                               lambda job: self._tokenized(request, job)))
                return
        except (PageWardenError, ProtocolError) as exc:
            self._reject(request, exc)
            return
        self._submit(request, ids)

    def _check_new_id(self, request_id: str) -> None:
        if request_id.startswith(CANARY_PREFIX):
            raise InvalidRequest(f"request id {request_id!r}: ids starting with {CANARY_PREFIX!r} are the "
                                 "engine's own canaries; choose another")
        if request_id in self.sup.book or request_id in self.sup.prompts.pending:
            # a worker may still answer for the earlier request of that id (a late
            # reservation, a transfer): one id, one request, for as long as it is remembered
            raise InvalidRequest(f"request id {request_id!r} was already used; ids are unique per engine run")

    def _tokenized(self, request: _Submit, job: TokenizeJob) -> None:
        """On the loop: a text prompt's tokens are back (or why they are not)."""
        try:
            if job.cancelled:
                self.sup.audit.record(request.request_id, "cancelled", reason="cancelled while its prompt was tokenized")
                self.sup.to_client(request.identity, pack({
                    "op": "error", "id": request.msg.get("id"), "request_id": request.request_id,
                    "error": {"code": "cancelled", "message": f"request {request.request_id} cancelled"}}))
            elif isinstance(job.result, PageWardenError):
                self._reject(request, job.result)
            elif isinstance(job.result, Exception):
                self._reject(request, InvalidRequest(f"request {request.request_id}: the prompt could not be "
                                                     f"tokenized: {type(job.result).__name__}: {job.result}"))
            else:
                self._submit(request, job.result)  # type: ignore[arg-type]  # deliver() hands it over set
        except Exception as exc:  # noqa: BLE001 - a bug of ours: reported and answered, as any handler's
            detail = self.sup.report_bug("control", request.caller[:32], exc)
            self.sup.to_client(request.identity, error_reply(request.msg.get("id"), "internal_error", detail))

    def tokenize_failed(self, job: TokenizeJob, exc: Exception) -> None:
        """A job whose `then` raised (it answers its own bugs; this is the last resort)."""
        self.sup.report_bug("control", job.owner[:32], exc)

    def _submit(self, request: _Submit, ids: list[int]) -> None:
        """Admission (I2) of a request whose prompt is token ids, then accept or reject."""
        sup, request_id, params = self.sup, request.request_id, request.params
        placeholder = False
        try:
            prompt = check_prompt_ids(request_id, ids, sup.model_config.vocab_size)
            self._check_new_id(request_id)  # again: another request may have taken it while this one tokenized
            SamplingParams(**{k: v for k, v in params.items() if k != "stream"}).validate(request_id)
            sup.book.check_budget(request.caller, request_id, len(prompt) + params["max_new_tokens"],
                                  sup.config.engine.max_requests_per_client, sup.config.engine.max_tokens_per_client)
            placeholder = self._admit(request_id, len(prompt), params["max_new_tokens"])
        except (PageWardenError, ProtocolError) as exc:
            self._reject(request, exc)
            return
        rec = self.accept(request_id, request.slot, prompt, params, request.tenant, request.identity,
                          request.msg.get("id"), data_tier=request.tier, budget_key=request.caller,
                          sub_client=request.sub_client)
        rec.owner = request.caller
        rec.placeholder = placeholder

    def _reject(self, request: _Submit, exc: PageWardenError | ProtocolError) -> None:
        sup = self.sup
        sup.counters["rejected"] += 1
        sup.audit.record(request.request_id, "rejected", code=exc.code, message=str(exc), tenant=_tenant_of(request.msg))
        if exc.code == "admission_rejected":
            sup.alert("admission_rejected", "info", str(exc),
                      subject=exc.limit_name,  # type: ignore[union-attr]  # only AdmissionRejected has this code
                      requests=[request.request_id], prevented=True)
        sup.to_client(request.identity, pack({"op": "error", "id": request.msg.get("id"),
                                              "request_id": request.request_id, "error": exc.to_wire()}))

    def accept(self, request_id: str, slot: int, prompt: list[int], params: dict, tenant: str,
               identity: bytes | None, msg_id, *, data_tier: str | None = None,
               budget_key: str | None = None, sub_client: str = "") -> RequestRecord:
        """Queue an admitted request, log it (never its text) and tell its client."""
        sup = self.sup
        rec = RequestRecord(request_id, slot, tenant, prompt, params, identity, msg_id, budget_key=budget_key,
                            sub_client=sub_client)
        sup.book.admit(rec)
        sup.mark_waiting(rec)
        sup.counters["admitted"] += 1
        sup.audit.record(request_id, "admitted", slot=slot, prompt_len=len(prompt), prompt_hash=rec.prompt_hash,
                         max_new_tokens=params["max_new_tokens"], tenant=tenant, data_tier=data_tier,
                         model=str(sup.config.model.resolved_path().name))
        sup.log_prompt({"request_id": request_id, "time": time.time(), "tenant": tenant,
                        "model": str(sup.config.model.resolved_path().name), "prompt_len": len(prompt),
                        "prompt_hash": rec.prompt_hash, "data_tier": data_tier})
        if identity is not None:
            sup.to_client(identity, pack({"op": "accepted", "id": msg_id, "request_id": request_id, "slot": slot}))
        sup.publish_request(rec)
        return rec

    def _admit(self, request_id: str, prompt_len: int, max_new: int) -> bool:
        """I2. Returns True when the placeholder_on_reject fault turned a rejection into a
        placeholder. With the admission defence off the check still runs, and reports."""
        sup = self.sup
        try:
            check_admission(
                request_id, prompt_len, max_new, context_window=sup.config.engine.context_window,
                pool_capacity_tokens={n: p.capacity_tokens(sup.config.engine.page_size)
                                      for n, p in sup.config.pools.items()},
            )
        except AdmissionRejected as exc:
            if sup.config.faults.placeholder_on_reject:
                sup.alert("admission_rejected", "info", f"{exc} (replaced by a placeholder: fault injected)",
                          subject=exc.limit_name, requests=[request_id], prevented=False)
                sup.audit.record(request_id, "placeholder", message=str(exc))
                return True
            if sup.config.defences.admission:
                raise
            sup.alert("admission_rejected", "warning", f"{exc} (let through: the admission defence is off)",
                      subject=exc.limit_name, requests=[request_id], prevented=False)
        return False

    def _params(self, msg: Message) -> dict:
        return {
            "max_new_tokens": field_of(msg, "max_new_tokens", "int", default=16),
            "temperature": float(field_of(msg, "temperature", "float", default=0.0)),
            "top_k": field_of(msg, "top_k", "int", default=0),
            "top_p": float(field_of(msg, "top_p", "float", default=1.0)),
            "seed": field_of(msg, "seed", "int", default=None),
            "ignore_eos": field_of(msg, "ignore_eos", "bool", default=False),
            "stop_token_ids": tuple(field_of(msg, "stop_token_ids", "list[int]", default=[], max_len=64)),
            "stream": field_of(msg, "stream", "bool", default=True),
        }

    def token_event(self, rec: RequestRecord, tokens: list[int]) -> list:
        return pack({"op": "token", "id": rec.msg_id, "request_id": rec.request_id,
                     "token_ids": [int(t) for t in tokens], "text": self.sup.text_delta(rec)})

    def op_cancel(self, identity: bytes, msg: Message) -> None:
        sup = self.sup
        rid = field_of(msg, "request_id", "str")
        rec = sup.book.get(rid)
        if rec is None and rid in sup.prompts.pending:  # its prompt is being tokenized: it ends when that is done
            job = sup.prompts.pending[rid]
            if job.owner != self.caller and self.role != "admin":
                sup.counters["forbidden"] += 1
                raise Forbidden(f"request {rid} belongs to another client; only it or an admin may cancel it")
            sup.prompts.cancel(rid)
            sup.audit.record(rid, "cancel_requested")
            self._reply(identity, msg, {"request_id": rid, "cancelled": True})
            return
        if rec is None or rec.done:
            raise InvalidRequest(f"request {rid!r} is not running")
        self._own(rec, "cancel")
        rec.cancel_requested = True
        sup.audit.record(rid, "cancel_requested")
        if rec.phase == Phase.PREFILLING and rec.prefill_worker:
            # I4: decode holds the pages until the prefill side acknowledges
            sup.to_worker(sup.workers[rec.prefill_worker], {"op": "cancel", "request_id": rid})
            sup.to_worker(sup.workers[rec.decode_worker], {"op": "cancel", "request_id": rid})
        elif rec.phase == Phase.AWAITING_PREFILL:
            sup.to_worker(sup.workers[rec.decode_worker], {"op": "release", "request_id": rid})
        elif rec.phase == Phase.DECODING:
            sup.to_worker(sup.workers[rec.decode_worker], {"op": "cancel", "request_id": rid})
        # RESERVING: on_reserved sees cancel_requested and releases
        sup.finish(rec, Phase.CANCELLED, "cancelled", {"code": "cancelled", "message": f"request {rid} cancelled"})
        self._reply(identity, msg, {"request_id": rid, "cancelled": True})

    # ---- state ------------------------------------------------------------------------
    def op_ping(self, identity: bytes, msg: Message) -> None:
        self._reply(identity, msg, {"pong": time.time()})

    def op_status(self, identity: bytes, msg: Message) -> None:
        """brief: leave out config and alerts (a window polling twice a second)."""
        sup = self.sup
        brief = field_of(msg, "brief", "bool", default=False)
        result = {
            "engine": {
                "version": __version__, "control": sup.control_endpoint, "telemetry": sup.telemetry_endpoint,
                "bus": sup.bus_endpoint,
                "curve": sup.curve is not None, "allow_faults": sup.allow_faults,
                "uptime_s": time.time() - sup.started_at, "started": sup.started_at,
                "hostname": socket.gethostname(),
                "time": time.time(), "monotonic": time.monotonic(),
                "model": str(sup.config.model.resolved_path()), "architecture": sup.model_config.architecture,
                "vocab_size": sup.model_config.vocab_size,
                "run": sup.evidence.journal.run if sup.evidence.journal is not None else None,
            },
            "config": shown_config(sup.config),
            "workers": [w.describe() for w in sup.workers.values()],
            "capacity": [f.to_dict() for f in sup.findings],
            "counters": dict(sup.counters),
            "load": sup.load(),
            "metrics": {**sup.metrics.snapshot(), **sup.metrics.totals()},
            "cross_reads": {"total": sup.reads.total, "dropped": sup.reads.dropped_reads},
            "crossings": self.crossings(),
            "telemetry_seq": dict(sup.telemetry.seq),
            "telemetry": sup.telemetry.describe(),
            "canaries": sup.canaries.describe(),
            "alert_forwarding": sup.forwarder.describe(),
            "evidence": sup.evidence.describe(),
        }
        if not brief:
            result["alerts"] = sup.alerts.records()
        else:
            del result["config"]
        self._reply(identity, msg, result)

    def crossings(self) -> dict:
        """Data that crossed between requests, for the app's banner: how many distinct (source,
        reader) pairs so far, and the newest ones with their tenants."""
        reads = self.sup.reads
        recent = [self._with_tenants(p) for p in reads.recent_pairs]
        return {"pairs": reads.pair_count, "reads": reads.total, "recent": recent}

    def _with_tenants(self, pair: dict) -> dict:
        """A (source, reader) pair with the tenants of both requests (None: unknown by now)."""
        def tenant(rid):
            rec = self.sup.book.get(rid) if rid else None
            return rec.tenant if rec is not None else None

        return {**pair, "source_tenant": tenant(pair["source"]), "reader_tenant": tenant(pair["reader"])}

    def fire_canary(self) -> RequestRecord:
        """Send one canary request now (tenant `canary`, a fresh random marker)."""
        sup = self.sup
        book = sup.canaries
        marker = book.new_marker()
        slot = next(sup.slots)
        request_id = f"{CANARY_PREFIX}{slot}"
        text = book.prompt(marker)
        prompt = sup.tokenizer.encode(text)
        marker_ids = sup.tokenizer.encode(marker)
        marker_ids = marker_ids[1:] if marker_ids and marker_ids[0] == sup.model_config.bos_token_id else marker_ids
        params = {**self._params(Message({})), "max_new_tokens": min(len(marker_ids) + 8, 64), "ignore_eos": True,
                  "stream": False}
        room = sup.config.engine.context_window - params["max_new_tokens"]
        prompt = prompt[:max(1, room)]
        book.add(request_id, slot, marker, marker_ids)
        sup.counters["canaries"] += 1
        return self.accept(request_id, slot, prompt, params, CANARY_TENANT, None, None, data_tier=CANARY_TENANT)

    def op_canary(self, identity: bytes, msg: Message) -> None:
        rec = self.fire_canary()
        canary = self.sup.canaries.by_request[rec.request_id]
        self._reply(identity, msg, {"request_id": rec.request_id, "slot": rec.slot, "marker": canary.marker})

    def op_scope(self, identity: bytes, msg: Message) -> None:
        """Affected pairs in a time window (wall-clock seconds; default everything kept), with
        their tenants where the requests are still known."""
        since = field_of(msg, "since", "float", default=None)
        until = field_of(msg, "until", "float", default=None)
        run = field_of(msg, "run", "str", default=None, max_len=64)
        if run is not None and run != self.sup.evidence.run:  # an earlier run (or "all"): the journal knows
            def answer(result):  # on the loop, once the journal's reader thread has it
                if isinstance(result, PageWardenError):
                    self.sup.to_client(identity, error_reply(msg.get("id"), result.code, str(result)))
                    return
                self._reply(identity, msg, {"pairs": result, "reads": sum(p["reads"] for p in result),
                                            "since": since, "until": until, "incomplete_before": None,
                                            "dropped_reads": 0, "run": run})

            self.sup.evidence.scope(since, until, run, answer)
            return
        pairs = [self._with_tenants(p) for p in self.sup.reads.scope(since, until)]
        reads = self.sup.reads
        self._reply(identity, msg, {"pairs": pairs, "reads": reads.total, "since": since, "until": until,
                                    "incomplete_before": reads.incomplete_before(since),
                                    "dropped_reads": reads.dropped_reads})

    def op_prompt_log(self, identity: bytes, msg: Message) -> None:
        since = field_of(msg, "since", "float", default=0.0)
        entries = [e for e in self.sup.prompt_log if e["time"] >= since]
        kept = self.sup.prompt_log.maxlen
        self._reply(identity, msg, {"entries": entries[-10_000:], "total": len(entries),
                                    "left_out": max(0, len(entries) - 10_000),
                                    "memory_limit": kept, "journal": self.sup.evidence.journal is not None})

    def op_history(self, identity: bytes, msg: Message) -> None:
        """What an incident snapshot needs of a time window (wall-clock seconds): the
        requests with their lifecycle events, and the telemetry published (bulk frames
        summarised). Prompts appear as length and hash only."""
        sup = self.sup
        since = field_of(msg, "since", "float", default=0.0)
        after = field_of(msg, "after", "int", default=0, low=0)
        limit = field_of(msg, "limit", "int", default=HISTORY_PAGE_SUBJECTS, low=1, high=HISTORY_PAGE_SUBJECTS)
        requests: list[dict]
        other: list[dict]
        requests, other, size, last, more = [], [], 0, after, None
        for subject, events, seq in sup.audit.since(since, after=after, limit=limit + 1):
            if len(requests) + len(other) >= limit or size >= HISTORY_PAGE_BYTES:
                more = last  # the page is full: the next one starts after the last subject in it
                break
            rec = sup.book.get(subject)
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
        frames, frames_left_out = sup.evidence.keyframes(since) if not after else ([], 0)
        # the telemetry kept comes with the first page; `next` asks for the page after this one
        self._reply(identity, msg, {"since": since, "until": time.time(), "requests": requests,
                                    "engine_events": other, "next": more,
                                    "telemetry": sup.telemetry.since(since) if not after else [],
                                    "keyframes": frames, "keyframes_left_out": frames_left_out,
                                    # older requests left memory (the journal keeps them): a window
                                    # that starts before forgotten_until is partial here
                                    "audit_kept": sup.audit.max_requests, "audit_forgotten": sup.audit.forgotten,
                                    "audit_forgotten_until": sup.audit.forgotten_until})

    def op_ground_truth(self, identity: bytes, msg: Message) -> None:
        """Every decode worker's own list of the cross-request reads it saw happen."""
        sup = self.sup
        workers = [w for w in sup.workers.role("decode") if w.state == WorkerState.READY]
        ask_id = next(sup.ask_ids)
        sup.pending_truth[ask_id] = {"client": identity, "id": msg.get("id"), "waiting": {w.name for w in workers},
                                     "reads": []}
        for worker in workers:
            sup.to_worker(worker, {"op": "cross_reads", "ask_id": ask_id})
        if not workers:
            sup.events.finish_truth(ask_id)

    def op_ack_alert(self, identity: bytes, msg: Message) -> None:
        ids = [str(i) for i in field_of(msg, "ids", "list", max_len=1000)]
        self._reply(identity, msg, {"acknowledged": self.sup.alerts.acknowledge(ids)})

    def op_audit(self, identity: bytes, msg: Message) -> None:
        rid = field_of(msg, "request_id", "str")
        rec = self.sup.book.get(rid)
        if rec is not None:
            self._own(rec, "read the audit of")
        elif self.role != "admin":
            raise Forbidden(f"request {rid!r} is not tracked; only an admin may read an untracked audit")
        self._reply(identity, msg, {"request_id": rid, "events": self.sup.audit.events(rid),
                                    "request": rec.describe() if rec else None})

    def op_keyframe(self, identity: bytes, msg: Message) -> None:
        self.sup.broadcast({"op": "keyframe"})
        pools = [w.info["pool"]["name"] for w in self.sup.workers.values() if w.state == WorkerState.READY]
        self._reply(identity, msg, {"pools": pools})

    def op_page_metadata(self, identity: bytes, msg: Message) -> None:
        pool = field_of(msg, "pool", "str")
        for worker in self.sup.workers.values():
            if worker.state == WorkerState.READY and worker.info.get("pool", {}).get("name") == pool:
                ask_id = next(self.sup.ask_ids)
                self.sup.pending_metadata[ask_id] = (identity, msg.get("id"))
                self.sup.to_worker(worker, {"op": "page_metadata", "ask_id": ask_id})
                return
        raise InvalidRequest(f"no ready worker owns pool {pool!r}")

    # ---- workers ----------------------------------------------------------------------
    def _worker(self, msg: Message):
        name = field_of(msg, "worker", "str")
        worker = self.sup.workers.get(name)
        if worker is None:
            raise InvalidRequest(f"no worker named {name!r}; workers: {', '.join(self.sup.workers)}")
        return worker

    def op_start(self, identity: bytes, msg: Message) -> None:
        worker = self._worker(msg)
        if worker.state not in (WorkerState.STOPPED, WorkerState.CRASHED):
            raise InvalidRequest(f"worker {worker.name} is {worker.state.value}; only a stopped or crashed worker can start")
        self.sup.workers.spawn(worker)
        self._reply(identity, msg, worker.describe())

    def op_stop(self, identity: bytes, msg: Message) -> None:
        worker = self._worker(msg)
        if worker.state in (WorkerState.STOPPED, WorkerState.CRASHED, WorkerState.STOPPING):
            raise InvalidRequest(f"worker {worker.name} is already {worker.state.value}")
        self.sup.stop_worker(worker)
        self._reply(identity, msg, worker.describe())

    def op_restart(self, identity: bytes, msg: Message) -> None:
        worker = self._worker(msg)
        self.sup.stop_worker(worker, restart=True)
        self._reply(identity, msg, worker.describe())

    def op_reconfigure(self, identity: bytes, msg: Message) -> None:
        """Validate first and report the capacity consequence; apply only when asked."""
        changes = field_of(msg, "changes", "map")
        apply = field_of(msg, "apply", "bool", default=False)
        if apply:  # who asked for what, before it is applied or refused
            self.sup.audit.record("engine", "reconfigure_requested", by=self.caller, role=self.role,
                                  changes=shown_changes(changes))
        self._reply(identity, msg, reconfigure(self.sup, changes, apply=apply))


def _tenant_of(msg: Message) -> str | None:
    """The tenant a rejected request named, if it named a usable one (for the evidence)."""
    tenant = msg.get("tenant")
    return tenant[:64] if isinstance(tenant, str) else None
