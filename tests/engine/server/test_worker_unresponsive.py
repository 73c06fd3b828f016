"""worker_unresponsive is pending while a worker's silence may be a long step, then fires
(counted, audited, offered to Alertmanager) if the silence goes on, and its heartbeat resolves
it: before, it could only ever be pending, so no receiver and no counter ever saw it."""

from __future__ import annotations


from engine.server.worker_pool import UNRESPONSIVE_FIRING_S, UNRESPONSIVE_S
from engine.wire.messages.to_supervisor import Heartbeat


def test_a_silent_worker_goes_pending_then_firing_then_resolves_on_its_heartbeat(supervisor):
    sup = supervisor
    offered = []
    sup.forwarder.offer = offered.append  # what the forwarder is offered
    worker = sup.workers["decode-0"]
    sup._worker_silent(worker, UNRESPONSIVE_S + 1)
    record = sup.alerts.alerts["worker_unresponsive:decode-0"]
    assert record["state"] == "pending" and not sup.counters["alert:worker_unresponsive"]
    assert all(r["state"] == "pending" for r in offered)  # the forwarder sends no pending alert
    sup._worker_silent(worker, UNRESPONSIVE_S + 2)  # still pending: one record, no new episode
    sup._worker_silent(worker, UNRESPONSIVE_FIRING_S + 1)
    record = sup.alerts.alerts["worker_unresponsive:decode-0"]
    assert record["state"] == "firing" and record["episode"] == 1
    assert sup.counters["alert:worker_unresponsive"] == 1
    assert [r["state"] for r in offered if r["state"] != "pending"] == ["firing"]
    sup._worker_silent(worker, UNRESPONSIVE_FIRING_S + 2)  # firing stays firing, counted once
    assert sup.counters["alert:worker_unresponsive"] == 1
    sup.events.on_heartbeat(worker, Heartbeat(free_pages=3, used_pages=1))
    assert sup.alerts.alerts["worker_unresponsive:decode-0"]["state"] == "resolved"
    assert worker.free_pages == 3


def test_a_firing_worker_unresponsive_resolves_when_the_worker_is_stopped(supervisor):
    """A condition alert never resolves on quiet: a stopped (not crashed) worker that was firing
    would have kept it firing, resent to Alertmanager, for ever."""
    sup = supervisor
    worker = sup.workers["prefill-0"]
    sup._worker_silent(worker, UNRESPONSIVE_FIRING_S + 1)
    assert sup.alerts.alerts["worker_unresponsive:prefill-0"]["state"] == "firing"
    sup._worker_exited(worker, crashed=False)
    assert sup.alerts.alerts["worker_unresponsive:prefill-0"]["state"] == "resolved"
