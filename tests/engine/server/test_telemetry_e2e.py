"""Telemetry on the real server: a subscriber that joins mid-run asks for a keyframe and,
from then on, deltas alone keep its page metadata equal to the workers'."""

from __future__ import annotations

import time

import numpy as np
import pytest

from engine.client import PageMirror
from engine.wire.protocol import PAGE_FIELDS

pytestmark = pytest.mark.e2e  # real engine processes


def _pump(sub, mirror, client, seconds: float, stats: dict) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        msg = sub.recv(0.05)
        if msg is None:
            continue
        applied = mirror.apply(msg)
        stats["keyframes" if msg.get("kind") == "keyframe" else "deltas"] += int(applied)
        if mirror.stale_pools():
            client.keyframe()  # a gap: resynchronise, as the GUI does


def _quiet(sub, mirror, client, stats, settle_s: float = 1.0, limit_s: float = 30.0) -> None:
    """Pump until no page message has come for settle_s (every worker's last delta is in)."""
    deadline = time.monotonic() + limit_s
    last = time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - last < settle_s:
        msg = sub.recv(0.05)
        if msg is not None:
            last = time.monotonic()
            stats["keyframes" if msg.get("kind") == "keyframe" else "deltas"] += int(mirror.apply(msg))


def test_late_subscriber_reconstructs_page_metadata(start_server):
    server = start_server(workers={"prefill": 1, "decode": 2})
    client = server.client()
    streams = [client.submit([256, *range(i, i + 30 + 7 * i)], max_new_tokens=40 + 3 * i, ignore_eos=True,
                             stream=False) for i in range(24)]
    # join while requests are running
    time.sleep(0.3)
    assert client.status()["load"]["queue_depth"] + client.status()["load"]["running"] > 0
    sub = server.subscriber(("pages/",))  # returns once the supervisor has the subscription
    mirror, stats = PageMirror(), {"keyframes": 0, "deltas": 0}
    client.keyframe()
    _pump(sub, mirror, client, 1.0, stats)
    for stream in streams:
        for msg in client.events(stream):
            if msg.op in ("done", "error"):
                assert msg.op == "done" and msg.get("error") is None
                break
    _quiet(sub, mirror, client, stats)
    assert stats["deltas"] > 0, "deltas were never exercised after the keyframe"
    pools = {w["pool"]["name"] for w in client.status()["workers"]}
    assert set(mirror.pools) == pools and not mirror.stale_pools()
    for name in pools:
        truth = client.page_metadata(name)
        for key in PAGE_FIELDS:
            np.testing.assert_array_equal(mirror.pools[name].arrays[key], truth[key], err_msg=f"{name}.{key}")
    # the decode pools really held pages of many requests during the run
    assert all((mirror.pools[f"decode-{i}"].arrays["epoch"] > 0).sum() > 0 for i in range(2))
    assert sub.dropped == 0


def test_topics_carry_sequence_numbers_and_lifecycle(start_server):
    server = start_server()
    client = server.client()
    sub = server.subscriber(("metrics", "requests", "workers", "capacity", "alerts"))
    done = client.generate([256, 1, 2, 3], max_new_tokens=5, ignore_eos=True, request_id="watched")
    seen: dict[str, list] = {}
    deadline = time.monotonic() + 12
    while time.monotonic() < deadline and not {"metrics", "workers", "capacity"} <= set(seen):
        msg = sub.recv(0.2)
        if msg is not None:
            seen.setdefault(msg.topic, []).append(msg)
    phases = [m.get("phase") for m in seen.get("requests", []) if m.get("request_id") == "watched"]
    assert phases[0] == "queued" and phases[-1] == "finished"
    assert {"reserving", "prefilling", "decoding"} <= set(phases)
    assert seen["requests"][-1].get("tokens") == len(done["token_ids"]) == 5
    for topic, messages in seen.items():
        seqs = [m.get("seq") for m in messages]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), topic
    metrics = seen["metrics"][-1]
    assert {"tokens_per_s", "ttft_ms_p50", "tpot_ms_p50", "queue_depth", "pools"} <= set(metrics.header)
    assert {w["name"] for w in seen["workers"][-1].get("workers")} == {"prefill-0", "decode-0"}
    assert all(not f["exceeds"] for f in seen["capacity"][-1].get("findings"))
