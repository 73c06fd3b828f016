"""watch-kv-events end to end on loopback: the test publisher (in a thread of this process)
speaks the vLLM / SGLang wire format; the CLI runs as a real process from the repo root.

No sleeps for the slow joiner: the publisher's XPUB reports when the subscription arrived,
and only then does the scenario publish. Timeouts are generous (a loaded 2-core machine)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import zmq

import main
from engine.adapters.kv_event_watch import KvEventWatcher
from engine.config import REPO_ROOT
from tests.kv_event_publisher import KvEventTestPublisher, removed, stored

pytestmark = pytest.mark.e2e  # real engine processes


REPO = REPO_ROOT
WATCH_SECONDS = 6  # the scenario takes milliseconds once the subscription is in; the rest is margin
JOIN_TIMEOUT_S = 60


def h(n: int) -> str:
    return f"{n:016x}"


def start_cli(*addresses: str, replay: tuple[str, ...] = ()) -> subprocess.Popen:
    argv = [sys.executable, "main.py", "watch-kv-events", *addresses]
    if replay:
        argv += ["--replay", *replay]
    argv += ["--seconds", str(WATCH_SECONDS), "--json"]
    return subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish_cli(proc: subprocess.Popen) -> dict:
    """The CLI's JSON summary, once the scenario is published (asserting the watch still ran)."""
    assert proc.poll() is None, f"the watch ended before the scenario was out: {proc.stderr.read()}"
    out, err = proc.communicate(timeout=WATCH_SECONDS + 120)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def join(proc: subprocess.Popen, *publishers: KvEventTestPublisher) -> None:
    """Once the CLI subscribed and asked for the history (from seq 0) on connecting: what is
    published from then on comes live, so a lost batch is a gap."""
    for pub in publishers:
        assert pub.wait_for_subscriber(JOIN_TIMEOUT_S), f"the CLI never subscribed to {pub.endpoint}"
        wait_for(lambda: pub.replay_requests == [0], f"the CLI never asked {pub.replay_endpoint} for history")


def wait_for(done, what: str, timeout_s: float = JOIN_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:  # only after a failure: the CLI ends by itself otherwise
        proc.kill()
        proc.communicate()


def gap_scenario(pub: KvEventTestPublisher, rank: int, variant: str = "vllm-array") -> None:
    """Stores, a removal, a batch lost in transit (the gap), then more: 5 blocks end up held."""
    pub.publish([stored([1, 2], None, range(32))], variant, rank)
    pub.publish([stored([3], 2, range(32, 48))], "vllm-extra" if variant == "vllm-array" else variant, rank)
    pub.publish([removed([1])], variant, rank)
    pub.publish([stored([4, 5], 3, range(48, 80))], variant, rank, lost=True)
    pub.publish([stored([6], 5, range(80, 96))], variant, rank)
    pub.publish([stored([7], None, range(16)), removed([6])], variant, rank)


def test_cli_sees_stores_and_removals_fills_a_gap_by_replay_and_survives_garbage():
    with KvEventTestPublisher() as pub:
        proc = start_cli(pub.endpoint, replay=(pub.replay_endpoint,))
        try:
            join(proc, pub)
            gap_scenario(pub, rank=0)
            for garbage in ("not-msgpack", "frame-count", "unknown-tag", "short-seq"):
                pub.send_garbage(garbage)
            pub.publish([stored([8], None, range(16))], "vllm-map", 0)  # bytes hashes, tagged maps
            pub.publish([stored([9], 7, range(16, 32))], "sglang-salted", 0)
            summary = finish_cli(proc)
        finally:
            stop(proc)
        assert pub.replay_requests == [0, 3]
    assert summary["endpoints"] == [pub.endpoint] and summary["seconds"] == WATCH_SECONDS
    assert summary["ranks"] == {"0": {"blocks": 7, "by_medium": {"GPU": 7}, "endpoints": [pub.endpoint]}}
    assert summary["events"] == {"BlockStored": 7, "BlockRemoved": 2, "AllBlocksCleared": 0}
    assert (summary["gaps"], summary["gaps_unfilled"], summary["replays"], summary["replay_failures"]) == (1, 0, 1, 0)
    assert summary["recent_gaps"] == [{"endpoint": pub.endpoint, "expected": 3, "got": 4, "filled": True}]
    # the two garbage batches with a seq come live, or first by the gap's replay when it runs
    # after they were published: then they are replay refusals, never refused live frames
    refusals = "\n".join(summary["recent_refusals"] + summary["recent_replay_refusals"])
    assert summary["refused"] + summary["replay_refused"] == 4, refusals
    assert summary["refused"] >= 2 and summary["notices"] == []
    for expected in ("payload is not msgpack", "3 frames expected (topic, seq, payload), got 2",
                     "unknown tag 'Foo'", "sequence number must be 8 bytes big-endian, got 2 bytes"):
        assert expected in refusals
    assert summary["last_seq"] == {pub.endpoint: 9}


def test_cli_watches_two_endpoints_as_two_ranks_each_with_its_own_gap():
    with KvEventTestPublisher() as first, KvEventTestPublisher() as second:
        proc = start_cli(first.endpoint, second.endpoint, replay=(first.replay_endpoint, second.replay_endpoint))
        try:
            join(proc, first, second)
            gap_scenario(first, rank=0)
            gap_scenario(second, rank=1, variant="sglang")
            second.publish([stored([11, 12], 7, range(32))], "sglang", 1)
            summary = finish_cli(proc)
        finally:
            stop(proc)
        assert first.replay_requests == [0, 3] and second.replay_requests == [0, 3]
    assert summary["ranks"] == {
        "0": {"blocks": 5, "by_medium": {"GPU": 5}, "endpoints": [first.endpoint]},
        "1": {"blocks": 7, "by_medium": {"unspecified": 7}, "endpoints": [second.endpoint]},
    }
    assert (summary["gaps"], summary["gaps_unfilled"], summary["replays"], summary["refused"]) == (2, 0, 2, 0)
    assert summary["last_seq"] == dict(sorted({first.endpoint: 5, second.endpoint: 6}.items()))


def watch_until(watcher: KvEventWatcher, done, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done(watcher.state):
        assert time.monotonic() < deadline, watcher.state.summary()
        watcher.poll(100)


def test_watcher_keeps_watching_when_a_replay_times_out_and_when_a_gap_cannot_be_filled():
    context = zmq.Context()
    deaf = context.socket(zmq.ROUTER)  # takes replay requests and never answers them
    deaf.setsockopt(zmq.LINGER, 0)
    deaf.bind("tcp://127.0.0.1:0")
    deaf_endpoint = deaf.getsockopt(zmq.LAST_ENDPOINT).decode()
    try:
        with KvEventTestPublisher(replay_endpoint=None) as pub, \
                KvEventWatcher([pub.endpoint], [deaf_endpoint], replay_timeout_ms=300) as watcher:
            assert pub.wait_for_subscriber(JOIN_TIMEOUT_S)
            pub.publish([stored([1], None, range(16))])
            pub.publish([stored([2], 1, range(16))], lost=True)
            pub.publish([stored([3], 2, range(16))])
            watch_until(watcher, lambda s: s.replay_failures == 1 and s.batches == 2)
            pub.skip(5)  # a second gap: a fresh replay socket asks again and times out again
            pub.publish([stored([4], 3, range(16))])
            watch_until(watcher, lambda s: s.replay_failures == 2 and s.batches == 3)
    finally:
        deaf.close(linger=0)
        context.term()
    state = watcher.state
    assert (state.gaps, state.gaps_unfilled, state.replays, state.history_failures) == (2, 2, 0, 1)
    assert list(state.notices) == [f"no replay answer from {deaf_endpoint} within 0.3 s: is the engine's replay "
                                   "endpoint bound there?"]
    assert state.summary()["ranks"]["0"]["blocks"] == 3 and state.find(0, h(2)) is None
    assert state.find(0, h(3)).root == state.find(0, h(4)).root == h(3)  # block 2 never came


def test_watcher_replay_skips_what_it_already_applied_and_reports_a_hole_the_buffer_lacks():
    with KvEventTestPublisher() as pub:
        with KvEventWatcher([pub.endpoint], [pub.replay_endpoint]) as watcher:
            assert pub.wait_for_subscriber(JOIN_TIMEOUT_S)
            watch_until(watcher, lambda s: s.history_fetches == 1)  # else the history brings the lost batch
            pub.publish([stored([1], None, range(16))])
            pub.publish([stored([2], 1, range(16))], lost=True)
            pub.publish([stored([3], 2, range(16))])
            watch_until(watcher, lambda s: s.replays == 1)
            pub.skip(2)  # seqs 3 and 4 exist nowhere: the replay brings nothing for them
            pub.publish([stored([4], 3, range(16))])
            watch_until(watcher, lambda s: s.replays == 2)
        state = watcher.state
    assert pub.replay_requests == [0, 1, 3]
    assert (state.gaps, state.gaps_unfilled, state.events["BlockStored"]) == (2, 1, 4)
    assert {state.find(0, h(n)).root for n in (1, 2, 3, 4)} == {h(1)}
    assert state.last_seq == {pub.endpoint: 5}


@pytest.mark.parametrize("argv, message", [
    (["tcp://127.0.0.1:5557", "--seconds", "0"], "--seconds 0 is out of range; it must be more than 0"),
    (["tcp://127.0.0.1:5557", "--seconds", "-2"], "--seconds -2 is out of range"),
    (["tcp://127.0.0.1:5557", "--replay", "tcp://127.0.0.1:1", "tcp://127.0.0.1:2", "--seconds", "1"],
     "--replay has 2 addresses for 1 ADDR; give at most one per ADDR"),
    (["127.0.0.1:5557", "--seconds", "1"], "address '127.0.0.1:5557' has no scheme; expected tcp://HOST:PORT"),
    (["tcp://*:5557", "--seconds", "1"], "address 'tcp://*:5557': * is the engine's bind wildcard"),
    (["tcp://127.0.0.1:70000", "--seconds", "1"], "port '70000' is not in 1..65535"),
    (["udp://127.0.0.1:5557", "--seconds", "1"], "scheme 'udp' is not supported"),
])
def test_bad_arguments_exit_2_naming_the_value_and_the_limit(argv, message, capsys):
    assert main.main(["watch-kv-events", *argv, "--json"]) == 2
    captured = capsys.readouterr()
    assert message in captured.err
    assert message in json.loads(captured.out.strip().splitlines()[-1])["error"]["message"]
