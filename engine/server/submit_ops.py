"""SubmitOps: a client's request from its message to the queue (admission, I2), its cancel,
and the canaries the engine submits on its own."""

from __future__ import annotations

import itertools
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from engine.admission import check_admission, check_prompt_ids
from engine.config import EngineConfig
from engine.errors import AdmissionRejected, InvalidRequest, PageWardenError
from engine.guard.canaries import CanaryBook
from engine.model.config import ModelConfig
from engine.request import SamplingParams
from engine.server.audit import AuditLog
from engine.server.control_call import Call
from engine.server.outbox import Outbox
from engine.server.prompt_text import PromptTokenizer, TokenizeJob, check_prompt_bytes
from engine.server.request_book import RequestBook
from engine.server.request_record import RequestRecord
from engine.server.request_route import RequestRoute
from engine.wire.messages import control, to_client
from engine.wire.protocol import CANARY_PREFIX, CANARY_TENANT, Message, ProtocolError, error_reply, field_of

if TYPE_CHECKING:
    from engine.model.tokenizer import TextTokenizer

class AdmittingEngine(Protocol):
    """What admitting a request needs of the supervisor, and no more."""

    config: EngineConfig
    model_config: ModelConfig
    book: RequestBook
    route: RequestRoute
    prompts: PromptTokenizer
    audit: AuditLog
    canaries: CanaryBook
    counters: Counter[str]
    outbox: Outbox
    slots: itertools.count[int]

    @property
    def tokenizer(self) -> TextTokenizer: ...

    def alert(self, kind: str, severity: str, detail: str, *, subject: str = "", condition: bool = False,
              **fields: Any) -> None: ...

    def report_bug(self, where: str, peer: str, exc: Exception) -> str: ...

    def log_prompt(self, entry: dict[str, Any]) -> None: ...

    def publish_request(self, rec: RequestRecord) -> None: ...


@dataclass
class _Submit:
    """One submit's fields, carried from its message to its admission (later, for a text prompt)."""

    call: Call
    slot: int
    request_id: str
    tenant: str
    tier: str | None
    sub_client: str
    params: dict[str, Any] = field(default_factory=dict)
    cache_salt: str | None = None


class SubmitOps:
    def __init__(self, engine: AdmittingEngine):
        self.engine = engine

    def submit(self, call: Call) -> None:
        """A text prompt is checked against its byte limit, then tokenized beside the loop
        (engine/server/prompt_text.py); its admission continues in _tokenized. Token ids go
        to admission at once."""
        engine, msg = self.engine, call.msg
        slot = next(engine.slots)
        # who the request is comes first: a refusal after this is audited under its id and tenant
        request_id = field_of(msg, "request_id", "str", default=f"r{slot}", max_len=128)
        request = _Submit(call, slot, request_id,
                          tenant=field_of(msg, "tenant", "str", default="default", max_len=64),
                          tier=field_of(msg, "data_tier", "str", default=None, max_len=64),
                          # the client behind this connection (the HTTP front names its peer): a turn of its
                          # own in the queue, within this connection's turn, so naming more of them gains nothing
                          sub_client=field_of(msg, "client", "str", default="", max_len=128))
        try:
            asked = call.read(control.Submit)
            request.params = asked.params()
            request.cache_salt = asked.cache_salt
            ids, text = asked.prompt_ids, asked.prompt
            if (ids is None) == (text is None):
                raise InvalidRequest(f"request {request_id}: give exactly one of 'prompt_ids' and 'prompt'")
            self._check_new_id(request_id)
            if text is not None:
                size = len(text.encode("utf-8", "surrogatepass"))
                check_prompt_bytes(request_id, size, engine.config.engine.context_window)
                engine.prompts.submit(TokenizeJob(request_id, text, size, call.who, engine.tokenizer.encode,
                                                  lambda job: self._tokenized(request, job)))
                return
        except (PageWardenError, ProtocolError) as exc:
            self._reject(request, exc)
            return
        assert ids is not None  # exactly one of the two was given, and not the text
        self._submit(request, ids)

    def _check_new_id(self, request_id: str) -> None:
        if request_id.startswith(CANARY_PREFIX):
            raise InvalidRequest(f"request id {request_id!r}: ids starting with {CANARY_PREFIX!r} are the "
                                 "engine's own canaries; choose another")
        if request_id in self.engine.book or request_id in self.engine.prompts.pending:
            # a worker may still answer for the earlier request of that id (a late
            # reservation, a transfer): one id, one request, for as long as it is remembered
            raise InvalidRequest(f"request id {request_id!r} was already used; ids are unique per engine run")

    def _tokenized(self, request: _Submit, job: TokenizeJob) -> None:
        """On the loop: a text prompt's tokens are back (or why they are not)."""
        engine, call = self.engine, request.call
        try:
            if job.cancelled:
                engine.audit.record(request.request_id, "cancelled", reason="cancelled while its prompt was tokenized")
                engine.outbox.event(call.identity, to_client.ErrorReply(
                    id=call.msg_id, request_id=request.request_id,
                    error={"code": "cancelled", "message": f"request {request.request_id} cancelled"}))
            elif isinstance(job.result, PageWardenError):
                self._reject(request, job.result)
            elif isinstance(job.result, Exception):
                self._reject(request, InvalidRequest(f"request {request.request_id}: the prompt could not be "
                                                     f"tokenized: {type(job.result).__name__}: {job.result}"))
            else:
                self._submit(request, job.result)  # type: ignore[arg-type]  # deliver() hands it over set
        except Exception as exc:  # noqa: BLE001 - a bug of ours: reported and answered, as any handler's
            detail = engine.report_bug("control", call.who[:32], exc)
            engine.outbox.to_client(call.identity, error_reply(call.msg_id, "internal_error", detail))

    def tokenize_failed(self, job: TokenizeJob, exc: Exception) -> None:
        """A job whose `then` raised (it answers its own bugs; this is the last resort)."""
        self.engine.report_bug("control", job.owner[:32], exc)

    def _submit(self, request: _Submit, ids: list[int]) -> None:
        """Admission (I2) of a request whose prompt is token ids, then accept or reject."""
        engine, request_id, params = self.engine, request.request_id, request.params
        limits = engine.config.engine
        try:
            prompt = check_prompt_ids(request_id, ids, engine.model_config.vocab_size)
            self._check_new_id(request_id)  # again: another request may have taken it while this one tokenized
            SamplingParams(**{k: v for k, v in params.items() if k != "stream"}).validate(request_id)
            engine.book.check_budget(request.call.who, request_id, len(prompt) + params["max_new_tokens"],
                                     limits.max_requests_per_client, limits.max_tokens_per_client)
            placeholder = self._admit(request_id, len(prompt), params["max_new_tokens"])
        except (PageWardenError, ProtocolError) as exc:
            self._reject(request, exc)
            return
        rec = self.accept(request_id, request.slot, prompt, params, request.tenant, request.call.identity,
                          request.call.msg_id, data_tier=request.tier, budget_key=request.call.who,
                          sub_client=request.sub_client)
        rec.owner = request.call.who
        rec.placeholder = placeholder
        rec.cache_salt = request.cache_salt

    def _reject(self, request: _Submit, exc: PageWardenError | ProtocolError) -> None:
        engine, call = self.engine, request.call
        engine.counters["rejected"] += 1
        engine.audit.record(request.request_id, "rejected", code=exc.code, message=str(exc),
                            tenant=_tenant_of(call.msg))
        if isinstance(exc, AdmissionRejected):
            engine.alert("admission_rejected", "info", str(exc), subject=exc.limit_name,
                         requests=[request.request_id], prevented=True)
        engine.outbox.event(call.identity, to_client.ErrorReply(id=call.msg_id, request_id=request.request_id,
                                                                error=exc.to_wire()))

    def accept(self, request_id: str, slot: int, prompt: list[int], params: dict[str, Any], tenant: str,
               identity: bytes | None, msg_id: int | str | None, *, data_tier: str | None = None,
               budget_key: str | None = None, sub_client: str = "") -> RequestRecord:
        """Queue an admitted request, log it (never its text) and tell its client."""
        engine = self.engine
        model = str(engine.config.model.resolved_path().name)
        rec = RequestRecord(request_id, slot, tenant, prompt, params, identity, msg_id, budget_key=budget_key,
                            sub_client=sub_client)
        engine.book.admit(rec)
        engine.route.placed(rec)
        engine.counters["admitted"] += 1
        engine.audit.record(request_id, "admitted", slot=slot, prompt_len=len(prompt), prompt_hash=rec.prompt_hash,
                            max_new_tokens=params["max_new_tokens"], tenant=tenant, data_tier=data_tier, model=model)
        engine.log_prompt({"request_id": request_id, "time": time.time(), "tenant": tenant, "model": model,
                           "prompt_len": len(prompt), "prompt_hash": rec.prompt_hash, "data_tier": data_tier})
        if identity is not None:
            engine.outbox.event(identity, to_client.Accepted(id=msg_id, request_id=request_id, slot=slot))
        engine.publish_request(rec)
        return rec

    def _admit(self, request_id: str, prompt_len: int, max_new: int) -> bool:
        """I2. Returns True when the placeholder_on_reject fault turned a rejection into a
        placeholder. With the admission defence off the check still runs, and reports."""
        engine, config = self.engine, self.engine.config
        # the [faults] and [defences] sections are generated from engine/wire/defences.py: typed Any
        faults: Any = config.faults
        defences: Any = config.defences
        try:
            check_admission(
                request_id, prompt_len, max_new, context_window=config.engine.context_window,
                pool_capacity_tokens={n: p.capacity_tokens(config.engine.page_size) for n, p in config.pools.items()},
            )
        except AdmissionRejected as exc:
            if faults.placeholder_on_reject:
                engine.alert("admission_rejected", "info", f"{exc} (replaced by a placeholder: fault injected)",
                             subject=exc.limit_name, requests=[request_id], prevented=False)
                engine.audit.record(request_id, "placeholder", message=str(exc))
                return True
            if defences.admission:
                raise
            engine.alert("admission_rejected", "warning", f"{exc} (let through: the admission defence is off)",
                         subject=exc.limit_name, requests=[request_id], prevented=False)
        return False

    def cancel(self, call: Call) -> None:
        engine = self.engine
        rid = call.read(control.Cancel).request_id
        rec = engine.book.get(rid)
        if rec is None and rid in engine.prompts.pending:  # its prompt is being tokenized: it ends when that is done
            call.may_act_for(engine.prompts.pending[rid].owner, rid, "cancel")
            engine.prompts.cancel(rid)
            engine.audit.record(rid, "cancel_requested")
            call.reply({"request_id": rid, "cancelled": True})
            return
        if rec is None or rec.done:
            raise InvalidRequest(f"request {rid!r} is not running")
        call.own(rec, "cancel")
        engine.route.cancel(rec)
        call.reply({"request_id": rid, "cancelled": True})

    # ---- canaries ---------------------------------------------------------------------------
    def fire_canary(self) -> RequestRecord:
        """Send one canary request now (tenant `canary`, a fresh random marker)."""
        engine = self.engine
        book = engine.canaries
        marker = book.new_marker()
        slot = next(engine.slots)
        request_id = f"{CANARY_PREFIX}{slot}"
        prompt = engine.tokenizer.encode(book.prompt(marker))
        marker_ids = engine.tokenizer.encode(marker)
        if marker_ids and marker_ids[0] == engine.model_config.bos_token_id:
            marker_ids = marker_ids[1:]
        params = {**control.Submit().params(), "max_new_tokens": min(len(marker_ids) + 8, 64), "ignore_eos": True,
                  "stream": False}
        room = engine.config.engine.context_window - params["max_new_tokens"]
        prompt = prompt[:max(1, room)]
        book.add(request_id, slot, marker, marker_ids)
        engine.counters["canaries"] += 1
        return self.accept(request_id, slot, prompt, params, CANARY_TENANT, None, None, data_tier=CANARY_TENANT)

    def canary(self, call: Call) -> None:
        rec = self.fire_canary()
        canary = self.engine.canaries.by_request[rec.request_id]
        call.reply({"request_id": rec.request_id, "slot": rec.slot, "marker": canary.marker})


def _tenant_of(msg: Message) -> str | None:
    """The tenant a rejected request named, if it named a usable one (for the evidence)."""
    tenant = msg.get("tenant")
    return tenant[:64] if isinstance(tenant, str) else None
