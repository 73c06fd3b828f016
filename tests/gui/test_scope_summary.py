"""scope_summary (Qt-free): the incident scope per tenant pair, as text and as a JSON document."""

from __future__ import annotations

import json

from gui.model.crossings import tenant_sentence
from gui.model.engine_state import AlertRow
from gui.model.scope_summary import page_text, scope_document, scope_text, tenant_pairs, utc

T0 = 1_700_000_000.0


def pair(reader, source, first, *, rt=None, st=None, pages=(("decode-0", 4),), reads=3, source_slot=1, **extra):
    p = {"reader": reader, "reader_slot": 9, "source": source, "source_slot": source_slot,
         "pages": [list(x) for x in pages], "first": first, "last": first + 2.0, "reads": reads, **extra}
    if rt is not None or st is not None:
        p.update(reader_tenant=rt, source_tenant=st)
    return p


def alert() -> AlertRow:
    return AlertRow("ownership_violation:decode-0", "ownership_violation", "critical", "firing", False,
                    T0, T0 + 10, 4, ["r2"], [4, 5], "request r2 read page 4", "decode-0")


PAIRS = [
    pair("r2", "r1", T0 + 3, rt="globex", st="acme", pages=(("decode-0", 4), ("decode-0", 5), ("decode-0", 7))),
    pair("r3", "r1", T0 + 1, rt="globex", st="acme", reads=2),
    pair("r4", None, T0 + 5, source_slot=12),  # no tenants sent, source forgotten
]


def test_the_sentence_names_both_tenants_or_says_none_is_known():
    assert tenant_sentence("globex", "acme") == "tenant globex received tenant acme's data"
    assert tenant_sentence(None, "acme") == "a request of no known tenant received tenant acme's data"
    assert tenant_sentence("globex", None) == "tenant globex received data of a request of no known tenant"


def test_pairs_group_by_tenant_pair_earliest_first_and_take_missing_tenants_from_the_lookup():
    groups = tenant_pairs(PAIRS, {"r4": "initech"}.get)
    assert [(g.reader_tenant, g.writer_tenant) for g in groups] == [("globex", "acme"), ("initech", None)]
    first = groups[0]
    assert [p["reader"] for p in first.pairs] == ["r3", "r2"]  # earliest first
    assert (first.first, first.last, first.reads, first.pages) == (T0 + 1, T0 + 5, 5, 3)
    assert groups[1].sentence == "tenant initech received data of a request of no known tenant"


def test_text_is_one_line_per_tenant_pair_with_request_pairs_pages_and_times():
    text = scope_text(alert(), PAIRS)
    lines = text.splitlines()
    assert len(lines) == 3  # the heading, then the two tenant pairs
    assert lines[0].startswith("Incident scope of alert ownership_violation:decode-0 (ownership_violation, critical")
    assert "2 tenant pair(s), 3 request pair(s)" in lines[0]
    assert lines[1].startswith("tenant globex received tenant acme's data: 2 request pair(s)")
    assert f"first {utc(T0 + 1)}, last {utc(T0 + 5)}" in lines[1]
    assert "r2 received data of r1 (pages decode-0:4-5,7; 3 read(s)" in lines[1]
    assert "r3 received data of r1" in lines[1]
    assert lines[2].startswith("a request of no known tenant received data of a request of no known tenant")
    assert "r4 received data of an unknown request (slot 12)" in lines[2]
    assert "no request received" in scope_text(alert(), [])


def test_json_document_has_the_alert_the_tenant_pairs_and_every_pair_whole():
    doc = json.loads(json.dumps(scope_document(alert(), PAIRS, {"r4": "initech"}.get)))
    assert doc["alert"]["id"] == "ownership_violation:decode-0" and doc["alert"]["kind"] == "ownership_violation"
    assert [(t["reader_tenant"], t["writer_tenant"]) for t in doc["tenant_pairs"]] == [
        ("globex", "acme"), ("initech", None)]
    globex = doc["tenant_pairs"][0]
    assert globex["summary"] == "tenant globex received tenant acme's data"
    assert [p["reader"] for p in globex["pairs"]] == ["r3", "r2"] and globex["first_utc"] == utc(T0 + 1)
    assert len(doc["pairs"]) == 3 and doc["pairs"][2]["reader_tenant"] == "initech"
    assert doc["pairs"][0]["pages"] == [["decode-0", 4], ["decode-0", 5], ["decode-0", 7]]
    assert scope_document(None, [])["tenant_pairs"] == [] and scope_document(None, [])["alert"] is None


def test_page_text_compresses_runs_and_caps_the_line():
    assert page_text([["b", 2], ["a", 1], ["a", 2], ["a", 3], ["a", 9]]) == "a:1-3,9; b:2"
    many = page_text([["d", 2 * i] for i in range(100)])
    assert many.endswith("… (+52 more)") and page_text([]) == "no pages"
