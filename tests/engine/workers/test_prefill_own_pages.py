"""I1 on the prefill side: a prompt page about to be shipped holds a token slot this request did
not write this epoch (another writer's tag, as a stale block table would leave it): the page
is not shipped, an ownership_violation alert names the request and its pages, the job fails
with that code, and the KV socket receives nothing. The same job with its pages untouched
ships. Real PrefillWorker, real model, real ipc sockets."""

from __future__ import annotations

from engine.wire.protocol import unpack
from tests.engine.workers.conftest import submit_prefill


def said_until(bus, last: str) -> list:
    messages = []
    while bus.poll(5000):
        messages.append(unpack(bus.recv_multipart()[1:]))
        if messages[-1].op == last:
            break
    return messages


def test_a_prompt_slot_another_request_wrote_is_never_shipped(prefill_rig, monkeypatch):
    bus, kv, kv_endpoint, worker = prefill_rig
    real_ship = worker._ship

    def ship_after_another_writer(job, first_token):
        page = int(job.request.page_table.pages[0])
        worker.engine.pool.token_writer[page, 3] = (99 << 32) | 1  # slot 99's tag, in this request's page
        real_ship(job, first_token)

    monkeypatch.setattr(worker, "_ship", ship_after_another_writer)
    submit_prefill(worker, kv_endpoint, rid="victim", slot=1)
    worker.work()
    messages = said_until(bus, "prefill_failed")
    alert = next(m for m in messages if m.op == "alert")
    assert alert.get("kind") == "ownership_violation" and alert.get("requests") == ["victim"]
    assert "did not write this epoch (slot 3: tag" in alert.get("detail")
    failed = messages[-1]
    assert failed.op == "prefill_failed" and failed.get("error")["code"] == "ownership_violation"
    assert not kv.poll(300)  # nothing of the page left for the decode side


def test_the_same_job_with_its_own_pages_ships(prefill_rig):
    bus, kv, kv_endpoint, worker = prefill_rig
    submit_prefill(worker, kv_endpoint, rid="clean", slot=2, pages=(12, 13))
    worker.work()
    messages = said_until(bus, "prefilled")
    assert messages[-1].op == "prefilled" and not any(m.op == "alert" for m in messages)
    assert kv.poll(5000)
