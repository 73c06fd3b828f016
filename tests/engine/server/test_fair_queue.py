"""FairQueue: clients take turns at the head of the line; naming more sub-clients gains nothing."""

from __future__ import annotations

from engine.server.fair_queue import FairQueue


def drain(q: FairQueue) -> list[str]:
    out = []
    while q:
        out.append(q.popleft())
    return out


def test_a_client_with_many_queued_requests_does_not_hold_back_another_clients_next_one():
    q = FairQueue()
    for i in range(1000):
        q.append(f"a{i}", ("A", ""))
    q.append("b0", ("B", ""))
    order = drain(q)
    assert order.index("b0") == 1  # one of A's, then B's: not after A's 1,000
    assert [r for r in order if r.startswith("a")] == [f"a{i}" for i in range(1000)]  # A's own order kept


def test_connections_take_turns_and_sub_clients_share_their_connections_turn():
    q = FairQueue()
    for i in range(4):
        for sub in range(50):  # one connection naming 50 sub-clients
            q.append(f"h{sub}.{i}", ("http", f"peer{sub}"))
        q.append(f"c{i}", ("cli", ""))
    order = drain(q)
    assert order[:8:2] == [f"h{s}.0" for s in range(4)] and order[1:8:2] == ["c0", "c1", "c2", "c3"]
    assert len(order) == 204 and len(set(order)) == 204


def test_a_request_sent_back_keeps_the_head_and_removal_keeps_the_turns():
    q = FairQueue()
    for rid, key in (("a0", ("A", "")), ("a1", ("A", "")), ("b0", ("B", "")), ("c0", ("C", ""))):
        q.append(rid, key)
    assert q[0] == "a0" and q.popleft() == "a0"
    q.appendleft("a0", ("A", ""))  # its reservation failed: back to the very head
    assert q[0] == "a0" and len(q) == 4 and "a0" in q
    q.remove("b0")
    assert "b0" not in q and drain(q) == ["a0", "c0", "a1"]
    assert not q and q.clients() == 0


def test_iteration_is_the_service_order_and_changes_nothing():
    q = FairQueue()
    for rid, key in (("a0", ("A", "")), ("a1", ("A", "")), ("b0", ("B", "x")), ("b1", ("B", "y"))):
        q.append(rid, key)
    assert list(q) == ["a0", "b0", "a1", "b1"] and len(q) == 4
    assert drain(q) == ["a0", "b0", "a1", "b1"]
