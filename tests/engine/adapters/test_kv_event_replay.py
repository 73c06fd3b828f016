"""The watcher against the replay forms the engines really send (issue 16): vLLM 0.26+ answers
(topic, seq, payload) and ends with (b"", END, b""), SGLang and older vLLM (seq, payload) and
(END, b""). History on connect, gaps filled, replay refusals counted apart from live ones,
and a notice naming an endpoint nothing answers on.

The test publisher runs in this process (its replay ROUTER in a thread); the watcher is
polled here. Every batch is also applied to a plain set of hashes: the truth the watcher's
blocks must equal at the end."""

from __future__ import annotations

import threading
import time

import pytest
import zmq

from engine.adapters.kv_event_watch import KvEventWatcher
from engine.commands.kv_events import format_table
from tests.kv_event_publisher import END_OF_REPLAY, KvEventTestPublisher, as_bytes, removed, stored

JOIN_TIMEOUT_S = 60
VARIANT = "vllm-map"  # what vLLM 0.32 sends: map batches and tagged map events


class Truth:
    """What the engine's cache holds: every batch published, lost in transit or not."""

    def __init__(self):
        self.blocks: set[str] = set()

    def publish(self, pub: KvEventTestPublisher, events: list[dict], lost: bool = False) -> int:
        for event in events:
            hashes = {as_bytes(n).hex() for n in event.get("block_hashes", [])}
            if event["type"] == "BlockStored":
                self.blocks |= hashes
            elif event["type"] == "BlockRemoved":
                self.blocks -= hashes
        return pub.publish(events, VARIANT, lost=lost)


def held(watcher: KvEventWatcher) -> set[str]:
    return {h for rank in watcher.state.ranks.values() for pool in rank.pools.values() for h in pool.blocks}


def watch_until(watcher: KvEventWatcher, done, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done(watcher.state):
        assert time.monotonic() < deadline, watcher.state.summary()
        watcher.poll(50)


def join(pub: KvEventTestPublisher, watcher: KvEventWatcher, fetches: int = 1) -> None:
    """Subscribed, and the history asked on connecting has been applied."""
    assert pub.wait_for_subscriber(JOIN_TIMEOUT_S)
    watch_until(watcher, lambda s: s.history_fetches == fetches)


def workload(pub: KvEventTestPublisher, truth: Truth, requests: int, lose=(),
             watcher: KvEventWatcher | None = None) -> int:
    """`requests` requests of 3 blocks each; every second one also frees the one before it
    (so a lost removal leaves blocks a watcher would keep forever). Batch i is lost in
    transit when i is in `lose`. With `watcher`, each batch that is sent is seen before the
    next is published, as when an engine steps. Returns the last seq."""
    seq = -1
    for i in range(requests):
        events = [stored([100 * i + 1, 100 * i + 2, 100 * i + 3], None, range(48))]
        if i % 2:
            events.append(removed([100 * (i - 1) + n for n in (1, 2, 3)]))
        lost = len(pub.buffer) in lose
        seq = truth.publish(pub, events, lost=lost)
        if watcher is not None and not lost:
            watch_until(watcher, lambda s, seq=seq: s.last_seq.get(pub.endpoint) == seq)
    return seq


@pytest.mark.parametrize("replay_form", ["vllm", "sglang"])
def test_replay_fills_every_gap_and_the_blocks_equal_the_engines(replay_form):
    truth = Truth()
    with KvEventTestPublisher(replay_form=replay_form) as pub, \
            KvEventWatcher([pub.endpoint], [pub.replay_endpoint]) as watcher:
        join(pub, watcher)
        workload(pub, truth, 16, lose={2, 3, 7, 10, 11, 12}, watcher=watcher)
        state = watcher.state
        assert held(watcher) == truth.blocks and len(truth.blocks) == 24
        assert (state.gaps, state.gaps_unfilled, state.replays, state.replay_failures) == (3, 0, 3, 0)
        assert (state.refused, state.replay_refused, state.notices) == (0, 0, type(state.notices)())
        assert pub.replay_requests == [0, 2, 7, 10]


def test_without_replay_the_lost_removals_leave_too_many_blocks():
    """The control for the test above: the same losses, no replay endpoint."""
    truth = Truth()
    with KvEventTestPublisher() as pub, KvEventWatcher([pub.endpoint]) as watcher:
        assert pub.wait_for_subscriber(JOIN_TIMEOUT_S)
        workload(pub, truth, 16, lose={2, 3, 7, 10, 11, 12}, watcher=watcher)
        assert held(watcher) != truth.blocks and watcher.state.gaps_unfilled == 3


@pytest.mark.parametrize("replay_form", ["vllm", "sglang"])
def test_a_watcher_started_late_gets_the_history_on_connecting(replay_form):
    truth = Truth()
    with KvEventTestPublisher(replay_form=replay_form) as pub:
        workload(pub, truth, 6)  # nobody subscribed: only the replay buffer keeps these
        before = set(truth.blocks)
        with KvEventWatcher([pub.endpoint], [pub.replay_endpoint]) as watcher:
            join(pub, watcher)
            assert held(watcher) == before and len(before) == 9
            assert watcher.state.history_batches == 6 and watcher.state.last_seq == {pub.endpoint: 5}
            last = truth.publish(pub, [stored([900], None, range(16)), removed([501, 502])])
            watch_until(watcher, lambda s: s.last_seq.get(pub.endpoint) == last)
            assert held(watcher) == truth.blocks
            assert (watcher.state.gaps, watcher.state.duplicates, watcher.state.refused) == (0, 0, 0)
        assert pub.replay_requests == [0]


def test_a_refused_replay_answer_is_counted_apart_from_refused_live_frames():
    truth = Truth()
    with KvEventTestPublisher() as pub, KvEventWatcher([pub.endpoint], [pub.replay_endpoint]) as watcher:
        join(pub, watcher)
        truth.publish(pub, [stored([1], None, range(16))])
        pub.publish_payload(b"\xc1 not msgpack", lost=True)  # the gap's one batch: refused when replayed
        last = truth.publish(pub, [stored([2], 1, range(16))])
        watch_until(watcher, lambda s: s.last_seq.get(pub.endpoint) == last)
        state = watcher.state
        assert (state.refused, state.replay_refused, state.gaps_unfilled) == (0, 1, 0)
        [refusal] = state.replay_refusals
        assert refusal.startswith(f"{pub.endpoint}: seq 1: replay frame 2: payload is not msgpack")
        pub.send_garbage("not-msgpack")  # the same refusal live: that one is a refused frame
        watch_until(watcher, lambda s: s.refused == 1)
        assert state.replay_refused == 1 and held(watcher) == truth.blocks


def serve_replay(router: zmq.Socket, answers: list[list[bytes]], stop: threading.Event) -> None:
    """A replay ROUTER answering every request with `answers`, then vLLM's end marker."""
    while not stop.is_set():
        if router.poll(20):
            identity = router.recv_multipart()[0]
            for frames in answers:
                router.send_multipart([identity, b"", *frames])
            router.send_multipart([identity, b"", b"", END_OF_REPLAY, b""])


def test_an_unreadable_replay_answer_is_a_replay_refusal_and_the_history_still_completes():
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind("tcp://127.0.0.1:0")
    stop = threading.Event()
    answers = [[b"kv", b"\x00\x01", b"x"], [b"a", b"b", b"c", b"d"]]  # a 2-byte seq; four frames
    server = threading.Thread(target=serve_replay, args=(router, answers, stop), daemon=True)
    server.start()
    try:
        with KvEventTestPublisher(replay_endpoint=None) as pub, \
                KvEventWatcher([pub.endpoint], [router.getsockopt(zmq.LAST_ENDPOINT).decode()]) as watcher:
            join(pub, watcher)
            state = watcher.state
            assert (state.refused, state.replay_refused, state.history_failures) == (0, 2, 0)
            refusals = "\n".join(state.replay_refusals)
            assert "replay frame 1: sequence number must be 8 bytes big-endian, got 2 bytes" in refusals
            assert "replay: 3 frames (topic, seq, payload) or 2 (seq, payload) expected, got 4" in refusals
    finally:
        stop.set()
        server.join(10)
        router.close(linger=0)
        context.term()


def test_nothing_bound_at_either_endpoint_is_said_naming_both(tmp_path):
    live, replay = f"ipc://{tmp_path}/kv-events", f"ipc://{tmp_path}/kv-replay"
    with KvEventWatcher([live], [replay], replay_timeout_ms=300, connect_timeout_ms=300) as watcher:
        watch_until(watcher, lambda s: len(s.notices) == 2, timeout_s=30)
        state = watcher.state
    first, second = state.notices
    assert first.startswith(f"nothing accepts connections at {live} after ")
    assert first.endswith("s: is the engine's KV-event endpoint bound there? (vLLM binds only for tcp://*:P, "
                          "tcp://[::]:P or ipc://PATH; given tcp://HOST:P it connects instead)")
    assert second == f"no replay answer from {replay} within 0.3 s: is the engine's replay endpoint bound there?"
    assert (state.history_failures, state.refused, state.replay_refused) == (1, 0, 0)
    table = format_table({**state.summary(), "endpoints": [live], "seconds": 1.0})
    assert f"notice: {first}" in table and f"notice: {second}" in table


def test_on_reconnecting_the_watcher_takes_what_it_missed_from_where_it_was(tmp_path):
    live, replay = f"ipc://{tmp_path}/kv-events", f"ipc://{tmp_path}/kv-replay"
    truth = Truth()
    with KvEventTestPublisher(live, replay) as pub, KvEventWatcher([live], [replay]) as watcher:
        join(pub, watcher)
        workload(pub, truth, 3, watcher=watcher)
        pub.reopen()  # the connection drops; what is published before it is back never arrives live
        truth.publish(pub, [stored([801, 802], None, range(32)), removed([201, 202, 203])], lost=True)
        truth.publish(pub, [removed([801])], lost=True)
        watch_until(watcher, lambda s: s.history_fetches == 2)
        assert held(watcher) == truth.blocks
        assert (watcher.state.restarts, watcher.state.gaps, watcher.state.last_seq) == (0, 0, {live: 4})
        assert pub.replay_requests == [0, 2]  # from the last seq held: the engine still has it


def test_a_restarted_engine_is_seen_on_reconnecting_and_its_history_taken(tmp_path):
    live, replay = f"ipc://{tmp_path}/kv-events", f"ipc://{tmp_path}/kv-replay"
    with KvEventWatcher([live], [replay]) as watcher:
        with KvEventTestPublisher(live, replay) as first:
            join(first, watcher)
            last = workload(first, Truth(), 3)
            watch_until(watcher, lambda s: s.last_seq.get(live) == last)
        with KvEventTestPublisher(live, replay) as second:  # the engine again, its counter from 0
            truth = Truth()
            truth.publish(second, [stored([7001, 7002], None, range(32))], lost=True)
            truth.publish(second, [stored([7003], 7002, range(16))], lost=True)
            watch_until(watcher, lambda s: s.history_fetches == 2)
            assert truth.blocks == held(watcher)  # the first engine's blocks went with it
            assert watcher.state.restarts == 1 and watcher.state.last_seq == {live: 1}
            assert second.replay_requests == [2, 0]  # from the last seq held, then from 0
