"""Engine: prefill and decode over one page pool, in one process: what `python main.py generate`
runs, the reference the disaggregated server is checked against, and each worker's core.

Admission happens in submit(), before anything is
allocated; a request that passes it waits for pages, and is never truncated.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from engine.admission import check_admission, check_prompt_ids
from engine.config import EngineConfig
from engine.errors import ConfigError, InvalidRequest, OwnershipViolation, SamplingFailed
from engine.isolate import each_alone
from engine.kv.page_pool import PageLayout, PagePool
from engine.kv.page_table import PageTable
from engine.kv.prefix_cache import PrefixCache
from engine.kv.prefix_keys import chain_keys, content_identities, reusable_pages, salt_of
from engine.model.load import LoadedModel, load_model
from engine.model_runner import ModelRunner
from engine.request import Request, RequestOutput, RequestState, SamplingParams
from engine.sampling import sample_next
from engine.scheduler import Scheduler
from engine.wire.page_tags import NO_WRITER, SHARED_OWNER, PageState, unpack_tag
from kernels.backend import select_kernels


@dataclass(frozen=True)
class IsolationCounts:
    """What I1 found for one request in one decode step (docs/INVARIANTS.md, I1)."""

    foreign: int  # token slots it needed that another request (or epoch) wrote
    unwritten: int  # token slots it needed that nothing wrote since their scrub
    stale_pages: int  # pages its block table names that the pool says are not its own

    def __bool__(self) -> bool:
        return bool(self.foreign or self.unwritten or self.stale_pages)

    def describe(self) -> str:
        parts = [f"{n} {what}" for n, what in ((self.foreign, "token slot(s) another request wrote"),
                                               (self.unwritten, "token slot(s) nothing wrote this epoch"),
                                               (self.stale_pages, "page(s) its block table names but it does not own"))
                 if n]
        return ", ".join(parts)


@dataclass
class EngineCounters:
    submitted: int = 0
    rejected: int = 0
    finished: int = 0
    failed: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    ownership_violations: int = 0
    cross_reads: int = 0
    steps: int = 0
    isolation_events: list[dict] = field(default_factory=list)


class Engine:
    """Prefill and decode over one pool. A decode worker uses it too: requests whose prompt
    KV arrives by transfer are reserved with reserve() and join the batch with adopt().

    pool: which configured pool this engine allocates from ("decode" or "prefill");
    pool_name: the name it goes by in telemetry (a worker's name).
    """

    def __init__(self, config: EngineConfig, model: LoadedModel | None = None, *,
                 pool: str = "decode", pool_name: str | None = None):
        self.config = config
        eng = config.engine
        self.model = model or load_model(
            config.model.resolved_path(), dtype=config.model.dtype, device=config.model.device,
            max_positions=eng.context_window,
            cpu_weight_layout=config.model.cpu_weight_layout,
        )
        cfg = self.model.config
        if eng.context_window > self.model.decoder.max_positions:
            raise ConfigError(
                f"context window {eng.context_window:,} exceeds the {self.model.decoder.max_positions:,} "
                f"positions the loaded model was prepared for; load it with max_positions >= the window"
            )
        if cfg.sliding_window is not None and eng.context_window > cfg.sliding_window:
            raise ConfigError(
                f"context window {eng.context_window:,} exceeds the model's sliding window "
                f"{cfg.sliding_window:,}; sliding-window attention is not implemented"
            )
        self.kernels = select_kernels(eng.kernels, self.model.device)
        layout = PageLayout(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, eng.page_size, self.model.dtype)
        # A single process prefills and decodes in the same pool: the decode pool.
        self.pool = PagePool(
            pool_name or pool, config.pools[pool].pages, layout, device=self.model.device,
            scrub_policy=eng.scrub_policy, scrub_fn=self.kernels.scrub_pages,
            provenance=config.audit.provenance,
        )
        self.pool.scrub_enabled = config.scrubs_freed_pages
        self.runner = ModelRunner(
            self.model.decoder, self.pool, self.kernels, check_writer_tags=config.defences.writer_tag_check
        )
        self.runner.write_into_shared = config.faults.shared_page_written
        # full prompt pages shared between requests of the same salt (None: the scope is "off")
        self.cache = (PrefixCache(self.pool, salt_ignored=config.faults.salt_ignored)
                      if config.prefix_cache.scope != "off" else None)
        self.scheduler = Scheduler(self.pool, max_batch=eng.max_batch, max_prefill_tokens=eng.max_prefill_tokens,
                                   table_for=self.table_for, release_table=self.release_table)
        self.counters = EngineCounters()
        self.requests: dict[str, Request] = {}
        self._slots = itertools.count(1)
        self._generators: dict[str, torch.Generator] = {}
        self._stop_ids = set(cfg.eos_token_ids)
        self.events: list[dict] = []

    # ---- requests -------------------------------------------------------------------
    def submit(
        self, prompt_ids: list[int], params: SamplingParams | None = None, *,
        request_id: str | None = None, tenant: str = "default", cache_salt: str | None = None,
    ) -> Request:
        """Validate and admit a request (I2). Raises InvalidRequest or AdmissionRejected,
        in which case nothing was allocated and the engine state is unchanged."""
        params = params or SamplingParams()
        slot = next(self._slots)
        request_id = request_id or f"r{slot}"
        if request_id in self.requests and not self.requests[request_id].done:
            raise InvalidRequest(f"request id {request_id!r} is already in use")
        self.counters.submitted += 1
        try:
            params.validate(request_id)
            prompt = check_prompt_ids(request_id, prompt_ids, self.model.config.vocab_size)
            check_admission(
                request_id, len(prompt), params.max_new_tokens,
                context_window=self.config.engine.context_window,
                pool_capacity_tokens={
                    n: p.capacity_tokens(self.config.engine.page_size) for n, p in self.config.pools.items()
                },
            )
        except Exception:
            self.counters.rejected += 1
            raise
        request = Request(request_id, prompt, params, tenant=tenant, slot=slot,
                          salt=self.salt_for(tenant, cache_salt))
        self.requests[request_id] = request
        self.scheduler.add(request)
        return request

    def salt_for(self, tenant: str, cache_salt: str | None) -> str | None:
        """The salt a request's prefix keys are rooted in (None: its pages are never shared)."""
        return salt_of(self.config.prefix_cache.scope, tenant, cache_salt)

    def table_for(self, request: Request, *, tokens: int | None = None, reuse: int | None = None) -> PageTable:
        """Pages for `tokens` of `request` (default its whole length): those of its prompt's
        leading full pages the prefix cache holds under its salt (at most `reuse` of them),
        then its own. Raises PoolExhausted, taking nothing, when its own do not fit (idle
        cached pages are evicted first)."""
        ps = self.pool.page_size
        total = self.pool.pages_for_tokens(request.total_tokens if tokens is None else tokens)
        if self.cache is None or request.salt is None:
            return PageTable.from_grant(request.slot, ps, self.pool.allocate(request.slot, total))
        full = request.prompt_len // ps
        keys = chain_keys(request.prompt_ids, ps, request.salt, full)
        reusable = reusable_pages(request.prompt_len, ps)
        table = self.cache.allocate_with_prefix(request.slot, request.prompt_ids, request.salt, total,
                                                reusable if reuse is None else min(reuse, reusable), keys)
        if self.pool.provenance is not None:
            table.truth = content_identities(request.prompt_ids, ps, request.salt, full)
        request.cached_tokens = int(table.shared.sum()) * ps if table.shared is not None else 0
        return table

    def release_table(self, table: PageTable):
        """Give a finished request's pages back; returns those it named but did not own."""
        if self.cache is None:
            return self.pool.release(table.slot, table.pages)
        return self.cache.release(table)

    def offer_prompt(self, request: Request) -> None:
        """Its full prompt pages are written: offer them to the prefix cache."""
        if self.cache is not None and request.salt is not None and request.page_table is not None:
            self.cache.offer(request.page_table, request.prompt_ids, request.salt,
                             request.prompt_len // self.pool.page_size)

    def prompt_arrived(self, request: Request) -> None:
        """A reserved request's prompt pages came by transfer and were verified: the prefix keys
        (its own, computed here) and the audit's identities go beside the full ones, which are
        then offered to the prefix cache."""
        table, ps = request.page_table, self.pool.page_size
        columns = np.arange(request.cached_tokens // ps, request.prompt_len // ps)
        if table is None or not len(columns):
            return
        pages = table.pages[columns]
        if table.keys is not None:
            index = torch.from_numpy(pages.astype(np.int64)).to(self.pool.device)
            self.pool.page_key[index] = torch.from_numpy(table.keys[columns]).to(self.pool.device)
        if self.pool.identity is not None and self.pool.provenance is not None and table.truth is not None:
            own = self.pool.provenance[pages] == request.slot  # content that came from elsewhere stays unnamed
            self.pool.identity[pages] = np.where(own, table.truth[columns][:, None], 0)
        self.offer_prompt(request)

    def reserve(self, request: Request) -> None:
        """Give `request` pages for its whole length now, outside the scheduler (its prompt
        KV will arrive by transfer, except the pages the prefix cache holds). Raises
        PoolExhausted, allocating nothing, if they do not fit."""
        request.page_table = self.table_for(request)
        self.requests[request.request_id] = request

    def adopt(self, request_id: str, first_token: int) -> list[RequestOutput]:
        """A reserved request whose prompt pages are now WRITTEN joins the decode batch,
        with the first token its prefill produced."""
        request = self.requests[request_id]
        request.state = RequestState.RUNNING
        self.scheduler.running.append(request)
        outputs: list[RequestOutput] = []
        self._emit([request], [first_token], outputs)
        return outputs

    def abort(self, request_id: str, error=None) -> None:
        request = self.requests.get(request_id)
        if request is not None and not request.done:
            self._finish(request, RequestState.FAILED, error.code if error else "aborted", error)

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    # ---- the loop --------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Prefill newly started requests, decode one token for the running ones."""
        self.pool.release_quarantine()
        plan = self.scheduler.schedule()
        outputs: list[RequestOutput] = []
        def fail(req: Request, error) -> None:
            self._fail_request(req, error, outputs)
        for batch, logits in each_alone(self.runner.prefill, self._checked_prefixes(plan.prefill, outputs),
                                        fail, "prefill"):
            for req in batch:
                written = req.page_table.pages[: self.pool.pages_for_tokens(req.prompt_len)]
                self.pool.set_state(req.slot, written[self.pool.owner[written] == req.slot], PageState.WRITTEN)
                self.offer_prompt(req)
            self.counters.prefill_tokens += sum(r.prompt_len - r.cached_tokens for r in batch)
            self._emit(batch, sample_next(logits, batch, self._generators), outputs)
        for batch, result in each_alone(self.runner.decode, plan.decode, fail, "decode step"):
            self._decoded(batch, result, outputs)
        self.counters.steps += 1
        return outputs

    def _checked_prefixes(self, requests: list[Request], outputs: list[RequestOutput]) -> list[Request]:
        """I1 over each cached prefix a prefill is about to attend. A request whose prefix
        fails it is aborted before it reads it (the defence on) or reported (off); a prefix
        it goes on to read is recorded in the provenance audit."""
        prevent = self.runner.check_writer_tags and self.config.engine.ownership_policy == "abort"
        go = []
        for req in requests:
            if req.cached_tokens:
                foreign, unwritten, _ = self.runner.prefix_violations(req)
                counts = IsolationCounts(foreign, unwritten, 0)
                if counts and prevent:
                    self._fail_ownership(req, counts, outputs, upto=req.cached_tokens)
                    continue
                if counts:
                    self._report_ownership(req, counts, (), prevented=False, upto=req.cached_tokens)
                reads = self.runner.prefix_cross_reads(req)
                if len(reads):
                    self._record_cross_reads(req, reads)
            go.append(req)
        return go

    def _decoded(self, batch: list[Request], result, outputs: list[RequestOutput]) -> None:
        """One decode step's result for `batch`: I1's verdict per request, then its token."""
        tokens = sample_next(result.logits, batch, self._generators)
        clean, clean_tokens = [], []
        prevent = self.runner.check_writer_tags and self.config.engine.ownership_policy == "abort"
        for row, (req, tok) in enumerate(zip(batch, tokens)):
            counts = IsolationCounts(int(result.foreign[row]), int(result.unwritten[row]),
                                     len(result.not_owned[row]))
            position = req.num_tokens - 1
            page = req.page_table.pages[position // self.pool.page_size]
            if position % self.pool.page_size == 0 and self.pool.owner[page] == req.slot:
                self.pool.set_state(req.slot, [page], PageState.WRITTEN)
            if len(result.cross_reads[row]):
                self._record_cross_reads(req, result.cross_reads[row])
            if counts and prevent:
                # I1: never emit a token computed with pages this request does not own.
                self._fail_ownership(req, counts, outputs, result.not_owned[row])
            else:
                if counts:  # the detector saw it; the defence is off or only reporting
                    self._report_ownership(req, counts, result.not_owned[row], prevented=False)
                clean.append(req)
                clean_tokens.append(tok)
        self.counters.decode_tokens += len(clean)
        self._emit(clean, clean_tokens, outputs)

    def run_until_idle(self) -> None:
        while self.has_work:
            self.step()

    def generate(self, prompts: list[list[int]], params: SamplingParams | None = None) -> list[Request]:
        """Submit every prompt, run to completion, return the requests in order."""
        requests = [self.submit(p, params) for p in prompts]
        self.run_until_idle()
        return requests

    # ---- internals -------------------------------------------------------------------
    def _emit(self, requests: list[Request], tokens: list, outputs: list[RequestOutput]) -> None:
        now = time.monotonic()
        for req, tok in zip(requests, tokens):
            if isinstance(tok, SamplingFailed):  # this request alone fails
                self._fail_request(req, tok, outputs)
                continue
            req.output_ids.append(tok)
            if req.first_token_time is None:
                req.first_token_time = now
            reason = self._finish_reason(req, tok)
            if reason:
                self._finish(req, RequestState.FINISHED, reason)
            outputs.append(RequestOutput(req.request_id, [tok], req.done, req.finish_reason))

    def _fail_request(self, req: Request, error, outputs: list[RequestOutput]) -> None:
        self._finish(req, RequestState.FAILED, error.code, error)
        outputs.append(RequestOutput(req.request_id, [], True, error.code, error))

    def _finish_reason(self, req: Request, tok: int) -> str | None:
        if not req.params.ignore_eos and tok in self._stop_ids:
            return "eos"
        if tok in req.params.stop_token_ids:
            return "stop"
        if len(req.output_ids) >= req.params.max_new_tokens:
            return "length"
        return None

    def _finish(self, req: Request, state: RequestState, reason: str, error=None) -> None:
        self.scheduler.release(req)
        self.requests.pop(req.request_id, None)  # a long-lived worker must not keep them all
        req.state, req.finish_reason, req.error = state, reason, error
        req.finish_time = time.monotonic()
        self._generators.pop(req.request_id, None)
        if state == RequestState.FINISHED:
            self.counters.finished += 1
        else:
            self.counters.failed += 1

    def take_events(self) -> list[dict]:
        """Isolation events since the last call (detections and, with provenance, the
        cross-request reads that really happened); the worker forwards them."""
        events, self.events = self.events, []
        return events

    def _record_cross_reads(self, req: Request, reads) -> None:
        self.counters.cross_reads += len(reads)
        self.events.append({"kind": "cross_read", "request": req.request_id, "slot": req.slot,
                            "pool": self.pool.name, "reads": [[int(p), int(s)] for p, s in reads],
                            "time": time.time()})

    def _report_ownership(self, req: Request, counts: IsolationCounts, foreign, *, prevented: bool,
                          upto: int | None = None) -> list[dict]:
        pages = self.ownership_report(req, foreign, upto)
        self.counters.ownership_violations += counts.foreign + counts.unwritten + counts.stale_pages
        event = {"kind": "ownership_violation", "request": req.request_id, "slot": req.slot,
                 "pool": self.pool.name, "pages": pages, "prevented": prevented,
                 # masked: the failing slots were kept out of attention (the defence is on)
                 "masked": self.runner.check_writer_tags, "foreign_slots": counts.foreign,
                 "unwritten_slots": counts.unwritten, "stale_pages": counts.stale_pages, "time": time.time()}
        self.counters.isolation_events.append(event)
        self.events.append(event)
        return pages

    def _fail_ownership(self, req: Request, counts: IsolationCounts, outputs: list[RequestOutput], foreign=(),
                        upto: int | None = None) -> None:
        pages = self._report_ownership(req, counts, foreign, prevented=True, upto=upto)
        own = [p["page"] for p in pages if p["owner"] == req.slot]
        if own:
            self.pool.set_state(req.slot, own, PageState.QUARANTINED)  # held as evidence, then scrubbed
        if self.cache is not None:  # a shared page that failed: nobody new may take it
            self.cache.withdraw([p["page"] for p in pages if p["owner"] == SHARED_OWNER])
        first = pages[0] if pages else {"page": "?", "writer": None, "expected": None}
        error = OwnershipViolation(
            f"request {req.request_id} (slot {req.slot}) met {counts.describe()}; first: page "
            f"{first['page']} of pool {self.pool.name!r} written by {first['writer']}, expected "
            f"{first['expected']}; they were masked and the request aborted before the token reached "
            f"the client",
            pages=pages,
        )
        self._fail_request(req, error, outputs)

    def ownership_report(self, req: Request, foreign=(), upto: int | None = None) -> list[dict]:
        """The pages of `req`'s context holding token slots it needed that fail I1 (another
        writer's, or nobody's this epoch), and those of `foreign` (its table's pages the pool
        says are not its own). Each names the page's writers of the failing slots."""
        table, ps = req.page_table, self.pool.page_size
        seq_len = req.num_tokens if upto is None else upto  # upto: only the first tokens were read
        n = self.pool.pages_for_tokens(seq_len)
        pages = table.pages[:n]
        index = torch.from_numpy(pages.astype(np.int64)).to(self.pool.device)
        tags = self.pool.token_writer[index].cpu().numpy()
        writer = self.pool.writer[index].cpu().numpy()
        filled = self.pool.filled[index].cpu().numpy()
        expected = table.expected_tags()[:n]
        # a shared page whose key is not the one this request computed fails whole
        wrong_key = self.pool.page_key[index].cpu().numpy() != table.expected_keys()[:n]
        report = []
        foreign = set(int(p) for p in foreign)
        for j, page in enumerate(pages):
            needed = min(ps, seq_len - j * ps)
            slot_tags = tags[j, :needed]
            failing = slot_tags if wrong_key[j] else slot_tags[slot_tags != expected[j]]
            if len(failing) or int(page) in foreign:
                others = [int(t) for t in np.unique(failing) if t != NO_WRITER]
                report.append({
                    "page": int(page), "owner": int(self.pool.owner[page]), "epoch": int(self.pool.epoch[page]),
                    "writer": unpack_tag(others[0] if others else int(writer[j])),
                    "writers": [unpack_tag(t) for t in others],
                    "expected": unpack_tag(int(expected[j])), "filled": int(filled[j]), "needed": int(needed),
                    "foreign_slots": int(sum(t != NO_WRITER for t in failing)),
                    "unwritten_slots": int(sum(t == NO_WRITER for t in failing)),
                })
        return report
