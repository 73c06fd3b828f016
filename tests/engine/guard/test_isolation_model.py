"""I1 holds under any interleaving: a hypothesis state machine over the real parts.

Two engines share the default model, as a prefill and a decode worker do: the prefill
engine's pool holds prompts written by the real forward pass; transfers are built by the real
sender (`iter_transfer`, one page per chunk so a stale reader can look mid-transfer) and fed
to the real `TransferReceiver`; the decode engine reserves, adopts and steps through the
real `ModelRunner.decode` (block-table check, per-token I1 detector, provenance); quarantined
pages are released on demand. Every defence and fault of engine/wire/defences.py is drawn per
run; a fault is injected by the code that injects it in a worker or the pool when the machine
runs that code, else by the machine's own rules (`INJECTED_BY` says which; a test checks that
each fault is met there).

After every step: the readers the detector names as having attended another writer's data
(unmasked) are exactly the readers the provenance says received another request's content
(recall and precision 100%), a masked read never reaches attention, and with every defence on
no foreign content is read at all.
"""

from __future__ import annotations

import inspect
import itertools
import os
import re
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, multiple, rule

from engine.config import EngineConfig
from engine.core import Engine
from engine.errors import PoolExhausted
from engine.kv.page_table import PageTable
from engine.request import Request, SamplingParams
from engine.wire.defences import DEFENCE_NAMES as DEFENCES
from engine.wire.defences import FAULT_NAMES as FAULTS
from engine.wire.page_tags import PageState
from engine.workers.decode import DecodeWorker
from engine.workers.prefill import _drop_last_page
from engine.workers.transfer.manifest import Reservation
from engine.workers.transfer.receive import TransferReceiver
from engine.workers.transfer.send import iter_transfer

PAGE = 4
# a two-page prefix some requests open with, so that the decode pool's prefix cache shares pages
PREFIX = [72, 101, 108, 108, 111, 44, 32, 119]
TENANTS = ("acme", "globex")
# faults that make no read alone: they keep the data another fault's read finds, so each
# directed run below turns them on beside its fault
ENABLERS = ("skip_scrub",)
_MODEL = {}


def _model():
    if "m" not in _MODEL:
        from engine.config import DEFAULT_MODEL_DIR
        from engine.model.load import load_model

        _MODEL["m"] = load_model(DEFAULT_MODEL_DIR, dtype="float32", device="cpu", max_positions=64)
    return _MODEL["m"]


class Flight(SimpleNamespace):
    """One request between the two engines: its prefill copy, its decode copy, its chunks."""


class IsolationMachine(RuleBasedStateMachine):
    flights = Bundle("flights")

    @initialize(defences=st.fixed_dictionaries({d: st.booleans() for d in DEFENCES}),
                faults=st.fixed_dictionaries({f: st.booleans() for f in FAULTS}))
    def start(self, defences, faults):
        config = EngineConfig().replace(
            model={"device": "cpu", "dtype": "float32"},
            engine={"kernels": "torch", "context_window": 64, "page_size": PAGE, "max_batch": 16},
            pools={"prefill": {"pages": 10}, "decode": {"pages": 14}},
            defences=defences, faults=faults,
        )
        self.config = config
        self.all_on = all(defences.values())
        self.prefill = Engine(config, _model(), pool="prefill")
        self.decode = Engine(config, _model(), pool="decode")
        self.receiver = TransferReceiver(self.decode.pool)
        self.receiver.verify_manifest = defences["manifest_check"]
        self.receiver.verify_ownership = defences["deferred_release"]
        # the decode worker's own fault code runs against this stand-in for its state
        self.worker = SimpleNamespace(engine=self.decode, faults=config.faults, swapped={})
        self.slots = itertools.count(1)
        self.epochs = itertools.count(1)
        self.live: dict[str, Flight] = {}
        self.truth_readers: set[str] = set()

    # ---- the prefill side -------------------------------------------------------------
    @rule(target=flights, prompt_len=st.integers(1, 12), new_tokens=st.integers(1, 8),
          over_long=st.booleans(), data=st.data(), shared=st.booleans(), tenant=st.sampled_from(TENANTS))
    def prefill_a_request(self, prompt_len, new_tokens, over_long, data, shared=False, tenant="acme"):
        slot = next(self.slots)
        rid = f"r{slot}"
        ids = list(data.draw(st.lists(st.integers(0, 255), min_size=prompt_len, max_size=prompt_len)))[:prompt_len]
        if shared:  # the common prefix, then a part of its own: 9 to 12 tokens
            ids = PREFIX + ids[: max(1, prompt_len - len(PREFIX))]
            prompt_len = len(ids)
        params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
        # an over-long request stands for one admission rejects; with the incident's fault and
        # the admission defence off, a one-token placeholder goes through prefill and transfer
        placeholder = over_long and self.config.faults.placeholder_on_reject and not self.config.defences.admission
        if over_long and not placeholder:
            return multiple()  # refused before anything was allocated
        sent = 1 if placeholder else prompt_len
        request = Request(rid, ids[:sent], params, slot=slot)
        pool = self.prefill.pool
        try:
            grant = pool.allocate(slot, pool.pages_for_tokens(sent))
        except PoolExhausted:
            return multiple()
        request.page_table = PageTable.from_grant(slot, PAGE, grant)
        logits = self.prefill.runner.prefill([request])
        pool.set_state(slot, grant.pages, PageState.WRITTEN)
        flight = Flight(rid=rid, slot=slot, ids=ids, params=params, prefill=request, sent=sent, tenant=tenant,
                        first_token=int(logits[0].argmax()), chunks=None, reservation=None)
        self.live[rid] = flight
        return flight

    # ---- the decode side -------------------------------------------------------------
    @rule(flight=flights)
    def reserve(self, flight):
        if flight.rid not in self.live or flight.reservation is not None:
            return
        request = Request(flight.rid, flight.ids, flight.params, tenant=flight.tenant, slot=flight.slot,
                          salt=self.decode.salt_for(flight.tenant, None))
        pool = self.decode.pool
        try:
            self.decode.reserve(request)  # through the decode pool's prefix cache, as DecodeWorker.on_reserve
        except PoolExhausted:
            return
        table = request.page_table
        first = request.cached_tokens // PAGE  # the cached pages stay out of the transfer
        prompt_pages = table.pages[first: pool.pages_for_tokens(len(flight.ids))]
        pool.set_state(flight.slot, prompt_pages, PageState.IN_FLIGHT)
        flight.reservation = Reservation(flight.rid, flight.slot, next(self.epochs), len(flight.ids),
                                         prompt_pages.astype(np.int32), table.epochs[first: first + len(prompt_pages)],
                                         first_page=first)
        self.receiver.expect(flight.reservation)
        DecodeWorker._inject_faults(self.worker, request, prompt_pages)
        try:
            messages = list(iter_transfer(self.prefill.pool, flight.prefill.page_table.pages[first:],
                                          flight.reservation, first_token=flight.first_token, tokens=flight.sent,
                                          chunk_bytes=self.prefill.pool.layout.bytes_per_page))
        except ValueError:  # a placeholder shorter than the cached pages: the prefill worker fails it
            self.prefill.pool.free(flight.slot, flight.prefill.page_table.pages)
            self._end(flight)
            return
        if self.config.faults.short_transfer:
            messages = _drop_last_page(messages)
        # the prefill side keeps its pages until the last chunk has left
        flight.chunks = [[bytes(f) for f in frames] for frames in messages]
        self.prefill.pool.free(flight.slot, flight.prefill.page_table.pages)

    @rule(flight=flights)
    def deliver_a_chunk(self, flight):
        if flight.rid not in self.live or not flight.chunks:
            return
        event = self.receiver.on_message(flight.chunks.pop(0))
        for note in self.receiver.take_notes():
            assert note.kind in ("mismatch_accepted", "late_write_landed"), note
        if event is None:
            return
        if event.kind == "complete":
            self.decode.prompt_arrived(self.decode.requests[flight.rid])
            self.decode.adopt(flight.rid, flight.first_token)
        elif event.kind == "mismatch":
            self._end(flight)
        else:
            assert event.kind == "late", event

    @rule()
    def decode_a_step(self):
        outputs = self.decode.step()
        self._check(self.decode.take_events())
        for out in outputs:
            if out.finished and out.request_id in self.live:
                self._end(self.live[out.request_id], aborted=False)

    @rule(flight=consumes(flights))
    def cancel(self, flight):
        if flight.rid in self.live:
            self._end(flight)

    @rule()
    def quarantine_runs_out(self):
        self.decode.pool.release_quarantine(now=float("inf"))

    # ---- checks ------------------------------------------------------------------------
    def _check(self, events):
        truth = {e["request"] for e in events if e["kind"] == "cross_read"}
        found = [e for e in events if e["kind"] == "ownership_violation" and _another_writer(e)]
        named = {e["request"] for e in found if e["foreign_slots"] and not e["masked"]}
        masked = {e["request"] for e in found if e["foreign_slots"] and e["masked"]}
        assert named == truth, (f"detector named {sorted(named)}, provenance says {sorted(truth)} read "
                                f"another request's data ({self.config.defences}, {self.config.faults})")
        assert not masked & truth, f"masked reads reached attention: {sorted(masked & truth)}"
        if self.all_on:
            assert not truth, f"with every defence on, {sorted(truth)} read another request's data"
        self.truth_readers |= truth

    @invariant()
    def pools_are_consistent(self):
        if not hasattr(self, "decode"):
            return
        for pool in (self.prefill.pool, self.decode.pool):
            free = pool.state == PageState.FREE
            assert (pool.owner[free] == -1).all() and pool.free_pages == int(free.sum())

    def _end(self, flight, aborted=True):
        self.live.pop(flight.rid, None)
        if flight.chunks is not None:
            self.receiver.cancel(flight.rid)
            flight.chunks = []
        if aborted:
            self.decode.abort(flight.rid)
        DecodeWorker._return_swapped(self.worker, flight.rid)
        if flight.reservation is None and self.prefill.pool.owner[flight.prefill.page_table.pages[0]] == flight.slot:
            self.prefill.pool.free(flight.slot, flight.prefill.page_table.pages)


IsolationMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get('PW_MODEL_EXAMPLES', 80)), stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestIsolationModel = IsolationMachine.TestCase

# Where the machine meets a fault: the worker and pool code it runs, and its own rules, which
# model the injections that live in code it does not run (the supervisor's admission in
# prefill_a_request, the prefill worker's _ship in reserve).
INJECTED_BY = (DecodeWorker._inject_faults, EngineConfig.scrubs_freed_pages.fget, Engine.__init__, IsolationMachine)


def _another_writer(event) -> bool:
    """A detection that names a writer other than the reader (a request that wrote into a page
    it shares finds its own tag there: its fault, not a read of another's data)."""
    writers = {tuple(w)[0] for p in event["pages"] for w in (p.get("writers") or [p.get("writer")]) if w}
    return not writers or writers != {event["slot"]}


def test_every_fault_is_injected_in_the_machine():
    """A fault that none of the machine's code reads would be drawn and do nothing, and the
    equality above would hold without testing it."""
    sources = "\n".join(inspect.getsource(code) for code in INJECTED_BY)
    unmet = [f for f in FAULTS if not re.search(rf"\bfaults\.{f}\b", sources)]
    assert not unmet, (f"the isolation state machine never injects the fault(s) {unmet}: none of "
                       f"{', '.join(code.__qualname__ for code in INJECTED_BY)} reads faults.<name>. Inject it in "
                       f"code the machine runs, or model its injection in a rule of IsolationMachine")


@pytest.mark.parametrize("fault", [f for f in FAULTS if f not in ENABLERS])
def test_each_fault_with_its_defence_off_makes_reads_that_are_all_named(fault):
    """The machine is not vacuous: a directed run of each fault with every defence off reads
    another request's data (so the equality above is tested on real reads)."""
    machine = IsolationMachine()
    machine.start({d: False for d in DEFENCES}, {f: f == fault or f in ENABLERS for f in FAULTS})
    flights = []
    for n in range(12):
        flight = machine.prefill_a_request(4 + n % 5, 6, fault == "placeholder_on_reject" and n % 2 == 0,
                                           _Draw(n), shared=fault in ("salt_ignored", "shared_page_written"),
                                           tenant=TENANTS[n % 2] if fault == "salt_ignored" else TENANTS[0])
        if isinstance(flight, Flight):
            flights.append(flight)
            machine.reserve(flight)
            while flight.chunks:
                machine.deliver_a_chunk(flight)
        for _ in range(3):  # let some finish, so that later ones get their unscrubbed pages
            machine.decode_a_step()
    for _ in range(12):
        machine.decode_a_step()
    assert machine.truth_readers, (f"{fault}: no cross-request read happened in a directed run with every defence "
                                   f"off and {', '.join(ENABLERS)} on: the machine does not exercise the fault")


class _Draw:
    """A stand-in for hypothesis' data.draw in the directed runs."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def draw(self, strategy):
        return [int(x) for x in self.rng.integers(0, 256, 12)]
