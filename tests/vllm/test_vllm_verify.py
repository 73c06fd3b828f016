"""The 2026 incident inside real vLLM 0.32 (CPU build), caught and stopped by the verifying connector.

Two vLLM instances, a producer (prefill) and a consumer (decode), both wrapping vLLM's own
ExampleConnector (KV through shared files) in PageWardenVerifyingConnector; tests/vllm/pd_router.py
sends each request to the producer with one new token, then to the consumer with the returned
kv_transfer_params. The same workload runs four times (fault off/on x verification off/on) and
once on a single vLLM instance (no disaggregation), whose greedy outputs are the reference. One
consumer serves all four rows: it runs with test_fault "per_request", so each request's params
say whether its load is faulted and checked (three vLLM starts for the module, not six).

The fault (short_transfer) leaves the last loaded blocks of a faulted consumer load unwritten while
the load reports finished: those blocks keep whatever the request that held them last left
there. The copy model repeats what its KV holds, so a reply that read them carries another
request's marker. PAGEWARDEN_VERIFY_RESULTS names a JSON file for the table (bench/RESULTS.md).
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import json
import os
import random
import re
import shutil
import tempfile
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from engine.client.engine_client import EngineClient
from engine.guard.reproduce import marker_leaks
from engine.guard.scenarios import copy_prompt
from engine.vllm_agent.verify import manifest as mf
from tests.vllm import pd_router
from tests.vllm.pd_config import digest_backend, transfer_config
from tests.vllm.vllm_server import VllmServer, free_port
from tests.waiting import wait_for

pytestmark = pytest.mark.vllm

REQUESTS = int(os.environ.get("PAGEWARDEN_VERIFY_REQUESTS", "200"))
CONCURRENCY = 16
BLOCKS = 256
TENANTS = ("acme", "globex", "initech")
FAULT_BLOCKS = 16  # every loaded block but the first: a reply of 36+ tokens runs past its own first block
COMMON = ("--max-num-batched-tokens", "4096")  # whole prompts in one step (ExampleConnector saves at the first)


def workload(seed: int = 36) -> list[dict]:
    rng = random.Random(seed)
    work = []
    while len(work) < REQUESTS:
        n = rng.randrange(80, 200)
        if n % 32 == 1:  # ExampleConnector's consumer looks up one block short of what its producer saved
            continue
        ids, secret = copy_prompt(rng, n, repeat=True)
        work.append({"prompt_ids": ids, "marker": secret, "max_new_tokens": rng.randrange(36, 44),
                     "tenant": rng.choice(TENANTS)})
    return work


def text_of(reply: dict) -> str:
    return reply["choices"][0]["text"]


def run_all(url_of, work: list[dict], tag: str) -> list[dict]:
    """url_of(i, w) -> a reply dict; CONCURRENCY at a time, in the workload's order."""
    with cf.ThreadPoolExecutor(CONCURRENCY) as pool:
        return list(pool.map(lambda iw: url_of(f"{tag}-{iw[0]}", iw[1]), enumerate(work)))


def leaks(work: list[dict], texts: list[str], tag: str) -> list[dict]:
    ids = [f"{tag}-{i}" for i in range(len(work))]
    return marker_leaks(ids, work, [{"token_ids": list(t.encode("latin-1", "replace"))} for t in texts])


def sent_as(request_id: str, tag: str) -> bool:
    """Whether vLLM's id for a request is one this test sent as `tag`-...: a completion's id is
    cmpl-<X-Request-Id>-0 plus vLLM's random tail."""
    return mf.external_id(request_id).startswith(f"cmpl-{tag}-")


def faulted_requests(log: str) -> set[str]:
    return {mf.external_id(m) for m in re.findall(r"short_transfer: request (\S+):", log)}


def named_requests(alerts: list[dict]) -> set[str]:
    return {mf.external_id(r) for a in alerts if a["kind"] == "transfer_mismatch" for r in a["requests"]}


def bad_inputs(producer: VllmServer, consumer: VllmServer, work: list[dict], reference: list[str]) -> dict:
    """Manifests that do not parse, are for another request, claim more blocks than the request
    holds, or are missing: each a recompute with the reference output, vLLM still serving."""
    w, other = work[0], work[1]
    good = pd_router.prefill(producer.url, w["prompt_ids"], "bad-base")
    assert good and mf.MANIFEST_KEY in good and len(good[mf.MANIFEST_KEY]["digests"]) == good[mf.MANIFEST_KEY]["blocks"]
    theirs = pd_router.prefill(producer.url, other["prompt_ids"], "bad-other")
    longer = dict(good[mf.MANIFEST_KEY], tokens=good[mf.MANIFEST_KEY]["tokens"] + 64,
                  blocks=good[mf.MANIFEST_KEY]["blocks"] + 2, digests=good[mf.MANIFEST_KEY]["digests"] + ["0" * 16] * 2)
    cases = {
        "does not parse": ("bad-base", {mf.MANIFEST_KEY: {"v": 1, "tokens": "many"}}),
        "for another request": ("bad-base", {**good, mf.MANIFEST_KEY: dict(good[mf.MANIFEST_KEY], request="cmpl-x-0")}),
        "another request's manifest": ("bad-base", theirs),
        "claims more blocks": ("bad-base", {**good, mf.MANIFEST_KEY: longer}),
        "missing": ("bad-base", None),
        "not a map": ("bad-base", {mf.MANIFEST_KEY: [1, 2, 3]}),
    }
    out = {}
    for name, (rid, params) in cases.items():
        reply = pd_router.decode(consumer.url, w["prompt_ids"], w["max_new_tokens"], rid, params)
        out[name] = text_of(reply) == reference[0]
    with EngineClient(consumer.agent_control) as client:
        alerts = wait_for(lambda: [a for a in client.status()["alerts"] if a["kind"] == "transfer_mismatch"
                                   and any(sent_as(r, "bad") for r in a["requests"])],
                          timeout_s=20, what="transfer_mismatch alerts for the bad manifests")
    out["alert reasons"] = sorted({a.get("reason", "")[:60] for a in alerts})
    out["alive"] = consumer.proc.poll() is None and text_of(pd_router.decode(
        consumer.url, w["prompt_ids"], w["max_new_tokens"], "bad-after", good)) == reference[0]
    return out


@pytest.fixture(scope="module")
def work() -> list[dict]:
    return workload()


@pytest.fixture(scope="module")
def reference(work) -> list[str]:
    """Greedy outputs of one vLLM instance, no disaggregation: what every row must match.
    Stopped before the pair starts (two cores)."""
    with VllmServer(num_blocks=BLOCKS, prefix_caching=False, extra_args=COMMON) as single:
        return [text_of(r) for r in run_all(lambda rid, w: single.complete(w["prompt_ids"], w["max_new_tokens"]),
                                            work, "single")]


@pytest.fixture(scope="module")
def pair():
    """A producer and one consumer for the whole module. The consumer runs with test_fault
    "per_request": each request's params say whether its load is faulted and checked, so one
    consumer (and its agent) serves all four rows and the app test, instead of a vLLM start
    per row."""
    store = tempfile.mkdtemp(prefix="pw-pd-store-")
    backend, env = digest_backend()
    control = f"tcp://127.0.0.1:{free_port()}"
    extra = {"agent": {"control": control, "telemetry": f"tcp://127.0.0.1:{free_port()}"},
             "test_fault": "per_request", "fault_blocks": FAULT_BLOCKS}
    with VllmServer(num_blocks=BLOCKS, prefix_caching=False, env=env,
                    extra_args=(*COMMON, *transfer_config("kv_producer", store))) as producer, \
            VllmServer(num_blocks=BLOCKS, prefix_caching=False, env={**env, "PAGEWARDEN_ALLOW_FAULTS": "1"},
                       extra_args=(*COMMON, *transfer_config("kv_consumer", store, **extra))) as consumer:
        consumer.agent_control = control
        yield SimpleNamespace(producer=producer, consumer=consumer, store=store, backend=backend)
    shutil.rmtree(store, ignore_errors=True)


def empty_store(store: str) -> None:
    """ExampleConnector serves any later request with the same prompt from the file the first
    one left; vLLM on CPU computes a prompt's KV to other low bits in another batch, so a file
    from an earlier row fails the check (rightly: it is not what this producer computed for this
    request). Each row starts from an empty store."""
    for entry in os.scandir(store):
        shutil.rmtree(entry.path)


def alert_keys(client: EngineClient) -> set[str]:
    return {a.get("key") or a["id"] for a in client.status()["alerts"]}


@pytest.fixture(scope="module")
def rows(work, reference, pair):
    started = time.monotonic()
    result = {"requests_per_row": len(work), "concurrency": CONCURRENCY, "tenants": list(TENANTS), "rows": {},
              "digest_backend": pair.backend}
    producer, consumer = pair.producer, pair.consumer
    with EngineClient(consumer.agent_control) as client:
        for fault, verify in ((False, False), (False, True), (True, False), (True, True)):
            row_started = time.monotonic()
            empty_store(pair.store)
            tag = f"{'fault' if fault else 'clean'}-{'verify' if verify else 'open'}"
            before = alert_keys(client)
            switch = {"fault": fault, "verify": verify}
            replies = run_all(lambda rid, w: pd_router.complete(producer.url, consumer.url, w["prompt_ids"],
                                                                 w["max_new_tokens"], rid, test=switch), work, tag)
            texts = [text_of(r) for r in replies]
            faulted = {r for r in faulted_requests(consumer.log_path.read_text(errors="replace")) if sent_as(r, tag)}

            def raised() -> list[dict]:
                return [a for a in client.status()["alerts"] if (a.get("key") or a["id"]) not in before
                        and a["kind"] != "capacity_exceeds_window"]

            # the agent's thread raises what the last steps reported: wait for every faulted
            # request of a checked row to be named, then a moment more for anything late
            if verify and faulted:
                wait_for(lambda: faulted <= named_requests(raised()), timeout_s=30,
                         what=f"{tag}: an alert for every faulted request")
            time.sleep(1.0)
            row = {"fault": fault, "verify": verify, "texts": texts, "leaks": leaks(work, texts, tag),
                   "alerts": raised(), "faulted": faulted,
                   "manifests": sum(1 for r in replies if (r["sent_kv_transfer_params"] or {}).get(mf.MANIFEST_KEY)),
                   "identical": sum(t == ref for t, ref in zip(texts, reference)),
                   "seconds": round(time.monotonic() - row_started, 1)}
            if fault is False and verify is True:
                row["bad_inputs"] = bad_inputs(producer, consumer, work, reference)
            result["rows"][tag] = row
    result["total_s"] = round(time.monotonic() - started, 1)
    if os.environ.get("PAGEWARDEN_VERIFY_RESULTS"):
        with open(os.environ["PAGEWARDEN_VERIFY_RESULTS"], "w") as f:
            json.dump(summary(result), f, indent=1)
    print(json.dumps(summary(result), indent=1))
    return result


def alert_kinds(alerts: list[dict]) -> dict[str, int]:
    return dict(collections.Counter(a["kind"] for a in alerts))


def summary(result: dict) -> dict:
    out = {k: v for k, v in result.items() if k != "rows"}
    out["rows"] = {}
    for tag, row in result["rows"].items():
        out["rows"][tag] = {
            "requests": result["requests_per_row"], "seconds": row["seconds"], "manifests": row["manifests"],
            "crossed_markers": len(row["leaks"]), "readers_leaked": len({x["reader"] for x in row["leaks"]}),
            "leak_examples": [{k: x[k] for k in ("reader", "source", "seen")} for x in row["leaks"][:5]],
            "faulted_requests": len(row["faulted"]), "alerts": len(row["alerts"]),
            "alert_kinds": alert_kinds(row["alerts"]),
            "requests_named_by_alerts": len(named_requests(row["alerts"])),
            "identical_to_single": row["identical"], **({"bad_inputs": row["bad_inputs"]} if "bad_inputs" in row else {})}
    return out


def test_every_manifest_reached_the_consumer_with_its_digests(rows):
    for tag, row in rows["rows"].items():
        assert row["manifests"] == rows["requests_per_row"], tag


def test_fault_off_verification_off_is_the_clean_baseline(rows):
    row = rows["rows"]["clean-open"]
    assert row["leaks"] == [] and row["alerts"] == [] and row["faulted"] == set()


def test_fault_off_verification_on_raises_nothing_and_matches_a_single_vllm(rows):
    row = rows["rows"]["clean-verify"]
    assert row["alerts"] == [] and row["leaks"] == []
    assert row["identical"] == rows["requests_per_row"]


def test_fault_on_verification_off_leaks_other_requests_markers(rows):
    """The incident in vLLM: without the check the short transfer is used, and replies carry
    other requests' markers (so the defence, not luck, is what stops it in the next row)."""
    row = rows["rows"]["fault-open"]
    assert len(row["faulted"]) >= rows["requests_per_row"] // 2
    assert len(row["leaks"]) >= 10 and row["alerts"] == []
    assert {x["reader"] for x in row["leaks"]} <= {f"fault-open-{i}" for i in range(rows["requests_per_row"])}


def test_fault_on_verification_on_stops_every_leak_names_every_request_and_recomputes(rows):
    row = rows["rows"]["fault-verify"]
    assert row["leaks"] == []
    assert row["faulted"] and row["faulted"] <= named_requests(row["alerts"])
    # and nothing else: vLLM's recompute of a failed load (tables ahead of their tokens) is
    # not read as a block table mismatch by the agent
    assert {a["kind"] for a in row["alerts"]} == {"transfer_mismatch"}, alert_kinds(row["alerts"])
    alert = row["alerts"][0]
    assert alert["pages"] and alert["expected"] and alert["found"] and alert["expected"] != alert["found"]
    assert row["identical"] == rows["requests_per_row"]


def test_bad_manifests_are_recomputed_and_never_crash_vllm(rows):
    bad = rows["rows"]["clean-verify"]["bad_inputs"]
    assert all(bad[name] for name in ("does not parse", "for another request", "another request's manifest",
                                      "claims more blocks", "missing", "not a map", "alive")), bad


@pytest.mark.gui
def test_the_app_attached_to_the_decode_instance_shows_quarantined_blocks_and_transfer_mismatch_alerts(qtbot, pair,
                                                                                                     work):
    """The desktop app attached to the consumer's agent, as to PageWarden's own engine: vLLM's
    blocks by owner request, the blocks that failed their check QUARANTINED, and the
    transfer_mismatch alerts naming their requests. VLLM_VERIFY_PNG=path saves the screenshot
    (docs/screenshot-vllm-verify.png is one)."""
    from engine.wire.page_tags import PageState
    from gui.main_window import MainWindow
    from gui.model.page_colors import QUARANTINED_PAGE
    from gui.transport import TransportThread

    empty_store(pair.store)
    window = MainWindow(theme="dark")
    qtbot.addWidget(window)
    window.resize(1280, 800)
    window.attach(TransportThread(pair.consumer.agent_control), pair.consumer.agent_control)
    window.show()
    qtbot.waitUntil(lambda: window.source.now.connected and "vllm" in window.state.pages.pools, timeout=60_000)
    stop = threading.Event()

    def keep_faulting(k: int) -> None:
        i = k
        while not stop.is_set():
            w = work[i % len(work)]
            pd_router.complete(pair.producer.url, pair.consumer.url, w["prompt_ids"], w["max_new_tokens"] + 60,
                               f"app-{i}", test={"fault": True, "verify": True})
            i += CONCURRENCY

    load = threading.Thread(target=lambda: list(cf.ThreadPoolExecutor(CONCURRENCY).map(keep_faulting,
                                                                                      range(CONCURRENCY))),
                            daemon=True)
    load.start()
    try:
        pool = window.state.pages.pools["vllm"]
        seen: dict = {}

        def quarantined_painted_and_named() -> bool:
            """What the app shows now, kept as one consistent look (the map moves on)."""
            window.refresh()
            blocks = np.flatnonzero(pool.arrays["state"] == PageState.QUARANTINED)
            image = window.page_map._views["vllm"].image.image.reshape(-1)
            alerts = [a for a in window.state.current_alerts() if a.kind == "transfer_mismatch"
                      and any(sent_as(r, "app") for r in a.requests)]
            owners = [window.state.request_for_slot(int(s)) for s in np.unique(pool.arrays["owner"][blocks])]
            seen.update(painted=[int(b) for b in blocks if image[b] == QUARANTINED_PAGE], alerts=alerts,
                        owners=owners)
            return bool(seen["painted"]) and len(alerts) >= 3 and None not in owners

        qtbot.waitUntil(quarantined_painted_and_named, timeout=120_000)
        # the quarantined blocks belong to requests of this load (their owners in the map), and
        # every alert names its request, its failed blocks and what was expected and found
        assert all(sent_as(r.request_id, "app") for r in seen["owners"])
        for alert in seen["alerts"]:
            assert alert.pages and alert.severity == "critical" and "expected" in alert.detail
        if os.environ.get("VLLM_VERIFY_PNG"):
            qtbot.waitUntil(lambda: len(window.state.metrics.get("tokens_per_s", ())) >= 5, timeout=20_000)
            qtbot.waitUntil(quarantined_painted_and_named, timeout=60_000)
            qtbot.wait(200)
            window.grab().save(os.environ["VLLM_VERIFY_PNG"])
    finally:
        stop.set()
        load.join(180)
    window.close()
