"""The supervisor survives what its handlers did not expect: a worker's ownership report
naming a page nobody wrote this epoch (`writer: null`) beside a canary's page, and any
other handler bug (answered, counted, alerted; the next message is served)."""

from __future__ import annotations

import contextlib
import threading

import pytest

from engine.client import EngineClient
from engine.client.engine_client import RemoteError
from engine.config import EngineConfig
from engine.server.supervisor import Supervisor


def test_an_ownership_report_with_an_unwritten_page_and_a_canary_page(supervisor):
    sup = supervisor
    sup.book.by_slot.update({3: "victim", 9: "canary-9"})
    sup.canaries.add("canary-9", 9, "marker", [1, 2])
    event = {"kind": "ownership_violation", "request": "victim", "slot": 3, "pool": "decode-0", "prevented": True,
             "pages": [{"page": 40, "writer": None}, {"page": 41, "writer": [9, 5]}, {"page": 42, "writer": "junk"}]}
    sup.isolation.ownership(event)  # the report that used to kill the supervisor
    alerts = {a["kind"]: a for a in sup.alerts.alerts.values()}
    assert alerts["canary_leak"]["pages"] == [41]  # only the canary's page, not the unwritten one
    assert alerts["canary_leak"]["requests"] == ["canary-9", "victim"]
    assert alerts["ownership_violation"]["pages"] == [40, 41, 42]
    assert "canary-9" in alerts["ownership_violation"]["detail"]


@contextlib.contextmanager
def serving_with_a_broken_audit(sup, monkeypatch):
    """The supervisor's loop in a thread, its `audit` handler raising KeyError (a bug)."""
    def broken(call):
        raise KeyError("a bug")

    monkeypatch.setitem(sup.ops.handlers, "audit", broken)
    stop = threading.Event()
    pump = threading.Thread(target=lambda: sup.run(until=stop.is_set), daemon=True)
    pump.start()
    try:
        yield
    finally:
        stop.set()
        pump.join(10)


def test_a_handler_bug_is_answered_alerted_and_the_engine_keeps_serving(supervisor, monkeypatch, capfd):
    sup = supervisor
    with serving_with_a_broken_audit(sup, monkeypatch):
        with EngineClient(sup.control_endpoint, timeout_s=30) as client:
            with pytest.raises(RemoteError) as caught:
                client.audit("r1")
            assert caught.value.code == "internal_error"
            assert "KeyError" in str(caught.value) and "keeps running" in str(caught.value)
            alerts = client.status()["alerts"]  # a later op on the same socket is served
            assert [a["kind"] for a in alerts] == ["internal_error"]
            assert "KeyError: 'a bug'" in alerts[0]["detail"]
    assert sup.counters["internal_errors"] == 1
    assert "Traceback" in capfd.readouterr().err  # the traceback went to the engine log


def test_handler_bugs_from_many_senders_make_one_alert_and_keep_the_critical_ones(supervisor, monkeypatch):
    """Issue 14, item 5: one internal_error alert per sender identity: 1,100 senders left 1,000
    of them and pushed the real worker_crashed alert out."""
    sup = supervisor
    sup.alert("worker_crashed", "critical", "decode-0 killed", subject="decode-0", condition=True)
    with serving_with_a_broken_audit(sup, monkeypatch):
        for i in range(1_100):
            with EngineClient(sup.control_endpoint, timeout_s=30) as client:  # a new identity each time
                with pytest.raises(RemoteError):
                    client.audit("r1")
        with EngineClient(sup.control_endpoint, timeout_s=30) as client:
            alerts = {a["id"]: a for a in client.status()["alerts"]}
    assert set(alerts) == {"worker_crashed:decode-0", "internal_error:control:KeyError"}
    assert alerts["internal_error:control:KeyError"]["count"] == 1_100


def test_a_malformed_reconfigure_is_a_validation_error_naming_the_key(supervisor):
    from engine.errors import ConfigError

    with pytest.raises(ConfigError, match="pools.prefill must be a table like {pages = 4096}, got 'ab'"):
        supervisor.reconfigure({"pools": {"prefill": "ab"}}, apply=False)
    assert supervisor.counters["internal_errors"] == 0


def test_request_ids_are_the_clients_once_and_never_a_canarys(supervisor):
    """A client id in the canaries' namespace (canary-<slot>, slots are sequential and every
    reply shows them) once made the supervisor's own canary collide with it; an id used again
    let a worker's late answer for the first request act on the second."""
    sup = supervisor
    stop = threading.Event()
    pump = threading.Thread(target=lambda: sup.run(until=stop.is_set), daemon=True)
    pump.start()
    try:
        with EngineClient(sup.control_endpoint, timeout_s=30) as client:
            ends = {}
            for rid in ("canary-7", "mine", "mine"):
                stream = client.submit(prompt_ids=[1, 2, 3], max_new_tokens=2, request_id=rid)
                ends.setdefault(rid, []).append(client.recv_for(stream, 20))
            refused = ends["canary-7"][0]
            assert refused.op == "error" and "'canary-7'" in refused.get("error")["message"]
            assert "the engine's own canaries" in refused.get("error")["message"]
            first, second = ends["mine"]
            assert first.op == "accepted"  # no workers: it waits in line
            assert second.op == "error" and "'mine' was already used" in second.get("error")["message"]
            client.call("cancel", request_id="mine")
            again = client.submit(prompt_ids=[1, 2, 3], max_new_tokens=2, request_id="mine")
            assert client.recv_for(again, 20).op == "error"  # ended is still used
    finally:
        stop.set()
        pump.join(10)
    assert [r.request_id for r in sup.book.values()] == ["mine"]


def test_a_taken_port_is_a_clear_error_and_leaves_nothing_open():
    """A supervisor that cannot bind closed nothing it had opened: its sockets and context were
    collected later, inside whatever test ran then (a ResourceWarning failed an unrelated test)."""
    import gc
    import warnings

    import zmq

    ctx = zmq.Context()
    taken = ctx.socket(zmq.ROUTER)
    port = taken.bind_to_random_port("tcp://127.0.0.1")
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with pytest.raises(zmq.ZMQError, match="Address already in use"):
                Supervisor(EngineConfig().replace(canaries={"enabled": False}), bind=f"tcp://127.0.0.1:{port}")
            gc.collect()
        assert not [w for w in seen if issubclass(w.category, ResourceWarning)], [str(w.message) for w in seen]
    finally:
        taken.close(0)
        ctx.term()
