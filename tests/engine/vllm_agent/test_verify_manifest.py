"""The verifying connector's manifest and digests, without vLLM: what a producer writes, what a
consumer accepts, and every bad manifest turned into a reason (a recompute), never an exception."""

from __future__ import annotations

import json
import random

import pytest
import torch

from engine.vllm_agent.verify import digest, manifest as mf

BS = 32
PROMPT = list(range(256, 256 + 100))  # 100 tokens: 3 full blocks and 4 rows


def producer_wire(request_id="cmpl-r7-0-1a2b3c4d", ids=PROMPT, digests=None) -> dict:
    wire = mf.new_manifest(request_id, ids, BS)
    mf.fill_digests(wire, digests if digests is not None else {p: 1000 + p for p in range(4)})
    return {"do_remote_prefill": True, mf.MANIFEST_KEY: json.loads(json.dumps(wire))}  # through HTTP's JSON


def check(params, request_id="cmpl-r7-0-9f8e7d6c", ids=PROMPT, loaded=None):
    return mf.expected_digests(mf.parse(params), request_id=request_id, token_ids=ids, block_size=BS,
                               loaded={0: BS, 1: BS, 2: BS} if loaded is None else loaded)


def test_a_producers_manifest_checks_out_on_the_consumer_under_vllms_other_request_id():
    assert mf.external_id("cmpl-r7-0-1a2b3c4d") == mf.external_id("cmpl-r7-0-9f8e7d6c") == "cmpl-r7-0"
    assert check(producer_wire()) == {0: 1000, 1: 1001, 2: 1002}
    assert mf.block_rows(100, BS) == [32, 32, 32, 4] and mf.block_rows(96, BS) == [32, 32, 32]
    # the partial last block is checked by its rows too
    assert check(producer_wire(), loaded={3: 4}) == {3: 1003}


def test_digests_are_hex_and_stay_exact_past_2_to_the_53():
    big = {p: (1 << 64) - 1 - p for p in range(4)}
    wire = producer_wire(digests=big)
    assert wire[mf.MANIFEST_KEY]["digests"][0] == "ffffffffffffffff"
    assert check(wire) == {p: big[p] for p in range(3)}


@pytest.mark.parametrize("params, words", [
    (None, "no PageWarden manifest"),
    ({}, "no PageWarden manifest"),
    ({mf.MANIFEST_KEY: "garbage"}, "does not parse"),
    ({mf.MANIFEST_KEY: {"v": 2}}, "version"),
    ({mf.MANIFEST_KEY: {**producer_wire()[mf.MANIFEST_KEY], "tokens": "100"}}, "must be integers"),
    ({mf.MANIFEST_KEY: {**producer_wire()[mf.MANIFEST_KEY], "blocks": 9}}, "it lists 9"),
    ({mf.MANIFEST_KEY: {**producer_wire()[mf.MANIFEST_KEY], "digests": ["zz"] * 4}}, "hex strings"),
    ({mf.MANIFEST_KEY: {**producer_wire()[mf.MANIFEST_KEY], "blocks": 10 ** 9}}, "does not parse"),
    ({mf.MANIFEST_KEY: {**producer_wire()[mf.MANIFEST_KEY], "request": None}}, "no request id"),
])
def test_a_manifest_that_does_not_parse_is_a_reason(params, words):
    assert words in check(params)


def test_a_manifest_for_another_request_or_prompt_is_refused():
    assert "is for request 'cmpl-other-0'" in check(producer_wire("cmpl-other-0-1a2b3c4d"))
    other_prompt = producer_wire(ids=list(reversed(PROMPT)))
    assert "for another prompt" in check(other_prompt)


def test_a_manifest_claiming_more_blocks_than_the_request_holds_is_refused():
    longer = producer_wire(ids=PROMPT + [300] * 64, digests={p: p for p in range(6)})
    assert "claims 6 blocks" in check(longer) and "holds 4" in check(longer)


def test_without_digests_nothing_is_trusted_and_a_loaded_block_the_manifest_lacks_fails():
    wire = mf.new_manifest("cmpl-r7-0-1a2b3c4d", PROMPT, BS)
    assert not mf.fill_digests(wire, {0: 1, 1: 2})  # some missing: none are put in
    assert "no digests" in check({mf.MANIFEST_KEY: wire})
    assert "lists 4 rows there" in check(producer_wire(), loaded={3: BS})
    assert "lists nothing there" in check(producer_wire(), loaded={4: BS})


def test_random_junk_never_raises():
    rnd = random.Random(3)
    values = [None, 0, -1, 1 << 70, "x", "", [], {}, 3.5, True, ["0" * 16], {"v": 1}]
    base = producer_wire()[mf.MANIFEST_KEY]
    for _ in range(2000):
        raw = dict(base)
        for key in rnd.sample(sorted(base) + ["extra"], rnd.randint(1, 4)):
            raw[key] = rnd.choice(values)
        assert isinstance(check({mf.MANIFEST_KEY: raw}), (str, dict))


# ---- digests over vLLM's paged layouts ----------------------------------------------------------
def cpu_layer(blocks=6, heads=1, head=8):
    return torch.randn(blocks, heads, BS, 2 * head)


def test_the_same_bytes_in_other_block_ids_give_the_same_digest_and_a_changed_row_does_not():
    layers = {"l0": cpu_layer(), "l1": cpu_layer()}
    moved = {k: v.clone() for k, v in layers.items()}
    for v in moved.values():
        v[4] = v[1]
    a = digest.digest_blocks(layers, [1, 2], [BS, BS], BS)[0]
    assert digest.digest_blocks(moved, [4, 2], [BS, BS], BS)[0].tolist() == a.tolist()
    moved["l1"][4, 0, 5, 3] += 1.0  # one key element of token 2 (row 5 of the raw [bs, 2*head] view)
    assert digest.digest_blocks(moved, [4], [BS], BS)[0][0] != a[0]


def test_a_partial_block_digest_covers_only_its_rows():
    layer = cpu_layer()
    rows = digest.token_rows(layer, BS)  # [blocks, bs, 2, heads, head], a view
    before = digest.digest_blocks({"l": layer}, [3], [4], BS)[0][0]
    view = layer.view(6, 1, 2, BS, 8)
    view[3, :, :, 10] = 7.0  # token 10's key and value: past the 4 valid rows
    assert digest.digest_blocks({"l": layer}, [3], [4], BS)[0][0] == before
    view[3, :, 1, 2] = 7.0  # token 2's value
    assert digest.digest_blocks({"l": layer}, [3], [4], BS)[0][0] != before
    assert rows.shape == (6, BS, 2, 1, 8) and rows.data_ptr() == layer.data_ptr()


def test_the_cpu_and_flash_layouts_of_the_same_tokens_digest_alike():
    cpu = cpu_layer(blocks=4, heads=2)
    flash = cpu.view(4, 2, 2, BS, 8).permute(2, 0, 3, 1, 4).contiguous()  # [2, blocks, bs, heads, head]
    assert digest.digest_blocks({"l": cpu}, [1, 3], [BS, 9], BS)[0].tolist() == \
        digest.digest_blocks({"l": flash}, [1, 3], [BS, 9], BS)[0].tolist()


def test_the_flash_layout_and_an_unknown_layout():
    flash = torch.randn(2, 5, BS, 2, 8)
    d, ok = digest.digest_blocks({"l": flash}, [0, 3], [BS, 7], BS)
    assert len(set(d.tolist())) == 2 and ok.all()
    odd = torch.randn(5, 3, 3)  # not a paged layout this knows: whole blocks; a partial one cannot be digested
    d, ok = digest.digest_blocks({"l": odd, "l2": cpu_layer()}, [1, 2], [BS, 5], BS)
    assert ok.tolist() == [True, False]


def test_copy_put_and_scrub_blocks():
    layers = {"l": cpu_layer(), "f": torch.randn(2, 5, BS, 1, 8)}
    saved = digest.copy_blocks(layers, [2, 3])
    before = digest.digest_blocks(layers, [2, 3], [BS, BS], BS)[0]
    digest.scrub_blocks(layers, [2, 3])
    assert not layers["l"][2:4].any() and not layers["f"][:, 2:4].any()
    digest.put_blocks(layers, [2, 3], saved)
    assert digest.digest_blocks(layers, [2, 3], [BS, BS], BS)[0].tolist() == before.tolist()
