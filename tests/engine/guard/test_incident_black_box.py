"""The incident, seen from outside, without timing: a placeholder over a victim's freed pages
answers with the victim's marker, and I1 names exactly that reader.

The end-to-end incident row cannot promise a marker in a reply: which freed pages the
placeholder is handed depends on which requests finished last, i.e. on timing. Here the
order is fixed: the victim finishes, its pages go back unscrubbed (skip_scrub) and, the free
list being a stack, come out first and in order for the placeholder's reservation, so the
stale K/V sits at the positions it was computed for (in both pools: the placeholder's one
prefill page is the victim's first, its stale slots travel with the transfer). The over-long request is as long as the
victim's prompt up to the last place that holds the placeholder's own first token, so the
placeholder's first decode step continues the victim's context where the victim had that
token: a copy model then answers with the victim's text.
"""

from __future__ import annotations

import random

from engine.config import EngineConfig
from engine.core import Engine
from engine.guard.scenarios import BOS, copy_prompt
from engine.kv.page_table import PageTable
from engine.request import Request, SamplingParams
from engine.wire.page_tags import PageState
from engine.workers.transfer.manifest import Reservation
from engine.workers.transfer.receive import TransferReceiver
from engine.workers.transfer.send import iter_transfer


def _engines(tiny_model, writer_tag_check: bool):
    config = EngineConfig().replace(
        model={"device": "cpu", "dtype": "float32"}, engine={"kernels": "torch", "page_size": 16},
        pools={"prefill": {"pages": 32}, "decode": {"pages": 64}},
        defences={"manifest_check": False, "writer_tag_check": writer_tag_check}, faults={"skip_scrub": True},
        prefix_cache={"scope": "off"},  # the incident's engine: freed prompt pages go back, not to a cache
    )
    return Engine(config, tiny_model, pool="prefill"), Engine(config, tiny_model, pool="decode")


def _placeholder_after_victim(tiny_model, writer_tag_check: bool):
    prefill, decode = _engines(tiny_model, writer_tag_check)
    ids, secret = copy_prompt(random.Random(7), 400, repeat=True)
    victim = decode.submit(ids, SamplingParams(max_new_tokens=4, ignore_eos=True), request_id="victim")
    decode.step()
    victim_pages = victim.page_table.pages.tolist()
    decode.run_until_idle()
    decode.take_events()
    assert victim.output_ids and decode.pool.used_pages == decode.pool.evictable_pages
    # the victim's prompt went through the prefill pool too, and left it unscrubbed
    in_prefill = Request("victim", ids, victim.params, slot=victim.slot)
    in_prefill.page_table = PageTable.from_grant(victim.slot, 16, prefill.pool.allocate(victim.slot, 25))
    prefill.runner.prefill([in_prefill])
    prefill.pool.free(victim.slot, in_prefill.page_table.pages)
    # the over-long request: prefill runs one token of it, decode reserves its whole length
    slot = 1000
    params = SamplingParams(max_new_tokens=80, ignore_eos=True)
    one = Request("placeholder", [BOS], params, slot=slot)
    one.page_table = PageTable.from_grant(slot, 16, prefill.pool.allocate(slot, 1))
    first = int(prefill.runner.prefill([one])[0].argmax())
    length = len(ids)
    stand_in = Request("placeholder", [BOS] * length, params, slot=slot)
    decode.reserve(stand_in)
    prompt_pages = stand_in.page_table.pages[: decode.pool.pages_for_tokens(length)]
    assert prompt_pages.tolist() == victim_pages[: len(prompt_pages)]  # the freed pages, in order
    decode.pool.set_state(slot, prompt_pages, PageState.IN_FLIGHT)
    reservation = Reservation("placeholder", slot, 1, length, prompt_pages, stand_in.page_table.epochs[: len(prompt_pages)])
    receiver = TransferReceiver(decode.pool)
    receiver.verify_manifest = False
    receiver.expect(reservation)
    events = [receiver.on_message(m) for m in iter_transfer(prefill.pool, one.page_table.pages, reservation,
                                                           first_token=first, tokens=1)]
    assert events[-1].kind == "complete"  # the defence is off: a short manifest is trusted
    decode.adopt("placeholder", first)
    found = []
    while not stand_in.done:
        decode.step()
        found += decode.take_events()
    text = bytes(t for t in stand_in.output_ids if t < 256).decode("latin-1")
    return secret, text, stand_in, victim, found


def test_the_placeholder_answers_with_the_victims_marker_and_is_named(tiny_model):
    secret, text, placeholder, victim, events = _placeholder_after_victim(tiny_model, writer_tag_check=False)
    assert secret[:12] in text, f"marker {secret!r} not in the placeholder's reply {text!r}"
    reads = [e for e in events if e["kind"] == "cross_read"]
    assert reads and {int(s) for e in reads for _, s in e["reads"]} == {victim.slot}  # provenance: the victim's
    named = {e["request"] for e in events if e["kind"] == "ownership_violation" and e["foreign_slots"]}
    assert named == {"placeholder"}


def test_with_the_writer_tag_check_on_the_reply_carries_nothing_of_the_victim(tiny_model):
    secret, text, placeholder, _, events = _placeholder_after_victim(tiny_model, writer_tag_check=True)
    assert placeholder.error is not None and placeholder.error.code == "ownership_violation"
    assert secret[:6] not in text and not [e for e in events if e["kind"] == "cross_read"]
