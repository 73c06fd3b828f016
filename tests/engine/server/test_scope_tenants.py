"""The `scope` op answers each affected pair with the tenants of both requests, where known."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

from engine.guard.read_log import ReadLog, ReadRecord
from engine.server.control_call import Call
from engine.server.query_ops import QueryOps
from engine.wire.protocol import Message, unpack


def test_scope_pairs_carry_reader_and_source_tenants():
    reads = ReadLog()
    reads.add(ReadRecord(100.0, "r2", 2, "r1", 1, "decode-0", 7))
    reads.add(ReadRecord(100.5, "r3", 3, None, 5, "decode-0", 9))  # a source nobody knows by now
    replies = []
    book = {"r1": SimpleNamespace(tenant="acme"), "r2": SimpleNamespace(tenant="globex")}  # r3: forgotten
    outbox = SimpleNamespace(to_client=lambda identity, frames: replies.append(unpack([bytes(f) for f in frames])))
    engine = SimpleNamespace(reads=reads, book=book, outbox=outbox)
    call = Call(b"peer", Message({"op": "scope", "id": 1}), "local:peer", "viewer", outbox, Counter())
    QueryOps(engine, engine).scope(call)
    pairs = replies[0].header["result"]["pairs"]
    assert [(p["reader"], p["reader_tenant"], p["source"], p["source_tenant"]) for p in pairs] == [
        ("r2", "globex", "r1", "acme"), ("r3", None, None, None)]
    assert pairs[0]["pages"] == [["decode-0", 7]] and pairs[0]["reads"] == 1
