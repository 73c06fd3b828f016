"""A hostile KV-event publisher cannot grow the watcher past its bounds, nor blind it.

Found against the watcher (before these bounds): a 10 MB frame of 2 M block hashes grew it
144 -> 621 MiB, and each such frame by as much again; 100 replay answers of 1 MB piled up,
decoded, before any was applied (901 MiB); one frame with sequence 2^63 made every later
real batch a silent duplicate.

The memory tests run the watcher in a child process (its peak RSS is the kernel's VmHWM: a
child of this large test process inherits pytest's ru_maxrss across exec) and compare its
growth with the bomb's size. The publisher runs here; nothing waits on a clock: the child
watches until a named condition holds, the parent publishes until the child is done."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections import deque

import msgpack
import pytest
import zmq

from engine.adapters.kv_event_decode import MAX_BATCH_HASHES, MAX_PAYLOAD_BYTES, decode_frames
from engine.adapters.kv_event_state import MAX_BLOCKS, BlockLimitError, KvEventState
from engine.adapters.kv_event_watch import MAX_FRAME_BYTES, MAX_SEQ_JUMP, KvEventWatcher
from engine.commands.kv_events import format_table
from engine.config import REPO_ROOT
from tests.kv_event_publisher import END_OF_REPLAY, KvEventTestPublisher, cleared, encode, removed, stored
from tests.waiting import wait_for

JOIN_TIMEOUT_S = 60
CHILD_TIMEOUT_S = 600  # before the bounds, the 10 MB frame alone took the child ~20 s here

# The watcher in a child: argv endpoint, replay ("-" for none), until ("held:HASH",
# "history" or "seq:N"), max_blocks ("-" for the default). Prints its peak RSS at the start
# and, once `until` holds, its peak and the state's summary.
CHILD = """
import json, sys
from engine.adapters.kv_event_state import KvEventState
from engine.adapters.kv_event_watch import KvEventWatcher

def peak_mib():
    status = dict(row.split(":", 1) for row in open("/proc/self/status").read().splitlines() if ":" in row)
    return int(status["VmHWM"].split()[0]) / 1024

endpoint, replay, until, max_blocks = sys.argv[1:5]
state = KvEventState() if max_blocks == "-" else KvEventState(max_blocks=int(max_blocks))
kind, _, value = until.partition(":")
done = {"held": lambda: state.find(0, value) is not None,
        "history": lambda: state.history_fetches + state.history_failures > 0,
        "seq": lambda: state.last_seq.get(endpoint) == int(value or -1)}[kind]
with KvEventWatcher([endpoint], [None if replay == "-" else replay], state=state) as watcher:
    start = peak_mib()
    print(json.dumps({"start_mib": start}), flush=True)
    while not done():
        watcher.poll(50)
    print(json.dumps({"start_mib": start, "peak_mib": peak_mib(), "summary": state.summary()}), flush=True)
"""

REAL = 0xFEED  # the honest batch's block hash


def child(endpoint: str, replay: str | None, until: str, max_blocks: int | None = None) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", CHILD, endpoint, replay or "-", until,
                             "-" if max_blocks is None else str(max_blocks)],
                            cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    json.loads(proc.stdout.readline())  # it watches
    return proc


def finish(proc: subprocess.Popen) -> dict:
    out, _ = proc.communicate(timeout=CHILD_TIMEOUT_S)
    assert proc.returncode == 0
    report = json.loads(out.strip().splitlines()[-1])
    report["grown_mib"] = report["peak_mib"] - report["start_mib"]
    return report


def hashes_payload(count: int, first: int = 1 << 20) -> bytes:
    """One BlockStored of `count` int hashes, each 5 bytes of msgpack (>= 2^16): a hash bomb."""
    return msgpack.packb([1.0, [["BlockStored", list(range(first, first + count)), None, [], 16, None, "GPU"]], 0])


def publish_until_done(pub: KvEventTestPublisher, proc: subprocess.Popen, what: str) -> None:
    """An honest batch each time round, until the child has seen one: what is sent while a
    dropped connection comes back is lost, what comes after arrives."""
    def honest_batch_then_done() -> bool:
        pub.publish([stored([REAL], None, range(16))])
        return proc.poll() is not None

    wait_for(honest_batch_then_done, CHILD_TIMEOUT_S, what)


def watch_until(watcher: KvEventWatcher, done, what: str) -> None:
    """Poll `watcher` until done(watcher.state) holds."""
    def polled() -> bool:
        watcher.poll(50)
        return done(watcher.state)

    wait_for(polled, JOIN_TIMEOUT_S, what, every_s=0)


def test_a_10_mb_frame_of_2m_hashes_never_reaches_the_watcher_and_honest_batches_still_do():
    bomb = hashes_payload(2_000_000)
    with KvEventTestPublisher(replay_endpoint=None) as pub:
        proc = child(pub.endpoint, None, f"held:{REAL:016x}")
        try:
            assert pub.wait_for_subscriber(JOIN_TIMEOUT_S)
            pub.publish_payload(bomb)
            publish_until_done(pub, proc, "an honest batch after the bomb to be applied")
            report = finish(proc)
        finally:
            proc.kill()
            proc.communicate()
    bomb_mib = len(bomb) / 2**20
    print(f"10 MB bomb ({bomb_mib:.1f} MiB): watcher peak {report['start_mib']:.1f} -> {report['peak_mib']:.1f} MiB")
    # before the bounds: +477 MiB (2 M blocks held); now libzmq drops the frame with its
    # connection (MAXMSGSIZE) before buffering it
    assert report["grown_mib"] < bomb_mib / 2, report
    summary = report["summary"]
    assert summary["ranks"]["0"]["blocks"] == 1 and summary["disconnects"] >= 1, summary
    assert any(f"a frame over {MAX_FRAME_BYTES:,} bytes" in notice for notice in summary["notices"]), summary


def test_a_hash_bomb_under_the_byte_limit_is_refused_by_count_and_costs_little():
    count = (MAX_PAYLOAD_BYTES - 64) // 5  # as many 5-byte hashes as the payload limit allows
    bomb = hashes_payload(count)
    assert len(bomb) <= MAX_PAYLOAD_BYTES
    with KvEventTestPublisher(replay_endpoint=None) as pub:
        proc = child(pub.endpoint, None, f"held:{REAL:016x}")
        try:
            assert pub.wait_for_subscriber(JOIN_TIMEOUT_S)
            pub.publish_payload(bomb)
            publish_until_done(pub, proc, "an honest batch after the bomb to be applied")
            report = finish(proc)
        finally:
            proc.kill()
            proc.communicate()
    bomb_mib = len(bomb) / 2**20
    print(f"{count:,}-hash bomb ({bomb_mib:.1f} MiB): watcher peak {report['start_mib']:.1f} -> "
          f"{report['peak_mib']:.1f} MiB")
    # before: +150 MiB (every hash held); now the decoded ints live only until they are counted
    assert report["grown_mib"] < 16 * bomb_mib, report
    summary = report["summary"]
    assert summary["ranks"]["0"]["blocks"] == 1 and summary["refused"] == 1, summary
    [refusal] = summary["recent_refusals"]
    assert f"{count:,} block hashes in one batch; the limit is {MAX_BATCH_HASHES:,}" in refusal


def test_the_blocks_held_are_bounded_and_a_batch_past_the_bound_is_refused_and_counted():
    limit, per_batch = 100_000, 50_000
    with KvEventTestPublisher(replay_endpoint=None) as pub:
        proc = child(pub.endpoint, None, "seq:3", max_blocks=limit)
        try:
            assert pub.wait_for_subscriber(JOIN_TIMEOUT_S)
            for n in range(3):  # 150,000 blocks: the third batch would pass the bound
                pub.publish_payload(hashes_payload(per_batch, first=(1 << 20) + n * per_batch))
            pub.publish([stored([REAL], None, range(16))])  # seq 3: still past it
            report = finish(proc)
        finally:
            proc.kill()
            proc.communicate()
    summary = report["summary"]
    print(f"{limit:,} blocks held: watcher peak {report['start_mib']:.1f} -> {report['peak_mib']:.1f} MiB")
    assert summary["ranks"]["0"]["blocks"] == limit and summary["block_limit"] == limit
    assert (summary["refused"], summary["over_block_limit"]) == (2, 2), summary
    assert any(f"the limit is {limit:,}" in r for r in summary["recent_refusals"]), summary["recent_refusals"]
    assert any(f"more than {limit:,} blocks, its limit" in notice for notice in summary["notices"]), summary["notices"]
    assert report["grown_mib"] < limit * 600 / 2**20, report  # ~600 bytes a block held, at most
    assert KvEventState().max_blocks == MAX_BLOCKS


def serve_replay(router: zmq.Socket, answers: list[list[bytes]], stop: threading.Event) -> None:
    """A replay ROUTER answering every request with `answers`, then vLLM's end marker."""
    while not stop.is_set():
        if router.poll(20):
            identity = router.recv_multipart()[0]
            for frames in answers:
                router.send_multipart([identity, b"", *frames])
            router.send_multipart([identity, b"", b"", END_OF_REPLAY, b""])


@pytest.fixture
def hostile_replay():
    """(endpoint, answers): a replay ROUTER in a thread of this process; fill `answers` first."""
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind("tcp://127.0.0.1:0")
    answers: list[list[bytes]] = []
    stop = threading.Event()
    server = threading.Thread(target=serve_replay, args=(router, answers, stop), daemon=True)
    server.start()
    yield router.getsockopt(zmq.LAST_ENDPOINT).decode(), answers
    stop.set()
    server.join(10)
    router.close(linger=0)
    context.term()


def tokens_payload(block: int, tokens: int) -> bytes:
    """A BlockStored of one block carrying `tokens` token ids of 5 bytes each (~5 bytes a token)."""
    return msgpack.packb([1.0, [["BlockStored", [block], None, list(range(1 << 16, (1 << 16) + tokens)), 16,
                                 None, "GPU"]], 0])


def test_replay_answers_are_applied_as_they_arrive_and_never_pile_up(hostile_replay):
    endpoint, answers = hostile_replay
    payload_count = 100
    answers += [[b"kv", seq.to_bytes(8, "big"), tokens_payload(1000 + seq, 200_000)] for seq in range(payload_count)]
    total_mib = sum(len(a[2]) for a in answers) / 2**20
    with KvEventTestPublisher(replay_endpoint=None) as pub:
        proc = child(pub.endpoint, endpoint, "history")
        try:
            report = finish(proc)
        finally:
            proc.kill()
            proc.communicate()
    print(f"{payload_count} replay answers ({total_mib:.0f} MiB): watcher peak {report['start_mib']:.1f} -> "
          f"{report['peak_mib']:.1f} MiB")
    # before: +757 MiB, every answer decoded and kept until the end marker came
    assert report["grown_mib"] < total_mib / 2, report
    summary = report["summary"]
    assert summary["history_fetches"] == 1 and summary["ranks"]["0"]["blocks"] == payload_count, summary


def test_a_replay_past_its_byte_budget_stops_and_says_so(hostile_replay):
    endpoint, answers = hostile_replay
    answers += [[b"kv", seq.to_bytes(8, "big"), tokens_payload(1000 + seq, 20_000)] for seq in range(40)]
    budget = 1 << 20  # ten 100 KB answers
    with KvEventTestPublisher(replay_endpoint=None) as pub, \
            KvEventWatcher([pub.endpoint], [endpoint], replay_max_bytes=budget) as watcher:
        watch_until(watcher, lambda s: s.history_failures == 1, "the history fetch to stop")
        state = watcher.state
    assert 0 < state.history_batches < 40 and state.summary()["ranks"]["0"]["blocks"] == state.history_batches
    [notice] = state.notices
    assert notice.startswith(f"replay from {endpoint} sent more than {budget:,} bytes (") and "stopped" in notice


def held(state: KvEventState) -> set[str]:
    return {h for rank in state.ranks.values() for pool in rank.pools.values() for h in pool.blocks}


def test_a_full_replay_buffer_is_taken_whole_though_the_engine_sends_faster_than_the_watcher_applies():
    """vLLM's replay ROUTER drops answers past its queue (1,000) while the watcher applies them
    one by one; the watcher asks again from the first one missing, so the history comes whole."""
    batches = 10_000  # vLLM's replay buffer
    with KvEventTestPublisher() as pub:
        for n in range(batches):
            pub.publish([stored([n + 1], n or None, range(16))], lost=True)
        with KvEventWatcher([pub.endpoint], [pub.replay_endpoint]) as watcher:
            watch_until(watcher, lambda s: s.history_fetches + s.history_failures, "the history")
            state = watcher.state
    assert (state.history_fetches, state.history_batches, state.gaps) == (1, batches, 0), state.summary()
    assert held(state) == {f"{n + 1:016x}" for n in range(batches)} and state.last_seq == {pub.endpoint: batches - 1}


class LossyReplay:
    """A replay ROUTER that, on its first request only, drops the answers in `drop` (and the
    end marker when "end" is in it), as an engine's full queue does; later ones are whole."""

    def __init__(self, payloads: dict[int, bytes], drop: set):
        self.payloads, self.drop, self.requests = payloads, drop, []
        self.context = zmq.Context()
        self.router = self.context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind("tcp://127.0.0.1:0")
        self.endpoint = self.router.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            if not self.router.poll(20):
                continue
            identity, _, start = self.router.recv_multipart()
            self.requests.append(int.from_bytes(start, "big"))
            lossy = len(self.requests) == 1
            for seq in sorted(s for s in self.payloads if s >= self.requests[-1]):
                if not (lossy and seq in self.drop):
                    self.router.send_multipart([identity, b"", b"kv", seq.to_bytes(8, "big"), self.payloads[seq]])
            if not (lossy and "end" in self.drop):
                self.router.send_multipart([identity, b"", b"", END_OF_REPLAY, b""])

    def __enter__(self) -> LossyReplay:
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(10)
        self.router.close(linger=0)
        self.context.term()


@pytest.mark.parametrize("drop, asked", [(set(range(100, 200)), [0, 100]),
                                         ({*range(250, 300), "end"}, [0, 250])],
                         ids=["mid-stream", "tail-and-end-marker"])
def test_answers_the_engine_dropped_are_asked_for_again_from_the_first_one_missing(drop, asked):
    payloads = {seq: msgpack.packb([1.0, [["BlockStored", [seq + 1], seq or None, [], 16, None, "GPU"]], 0])
                for seq in range(300)}
    with LossyReplay(payloads, drop) as replay, KvEventTestPublisher(replay_endpoint=None) as pub, \
            KvEventWatcher([pub.endpoint], [replay.endpoint]) as watcher:
        watch_until(watcher, lambda s: s.history_fetches + s.history_failures, "the history")
        state = watcher.state
    assert replay.requests == asked
    assert (state.history_fetches, state.history_batches) == (1, 300) and state.notices == deque(), state.summary()
    assert held(state) == {f"{seq + 1:016x}" for seq in range(300)}


def test_a_batch_past_the_block_bound_is_refused_whole_and_one_that_clears_first_is_not():
    state = KvEventState(max_blocks=4)
    state.apply(decode_frames([b"", (0).to_bytes(8, "big"), encode([stored([1, 2, 3], None, range(48))],
                                                                    "vllm-array")]), "e")
    over = decode_frames([b"", (1).to_bytes(8, "big"), encode([removed([1, 2]), stored([4, 5], 3, range(32))],
                                                              "vllm-array")])
    with pytest.raises(BlockLimitError, match="batch 1 would make the watcher hold 5 blocks; the limit is 4"):
        state.apply(over, "e")  # removals are not counted: the bound holds at every point of a batch
    assert (state.block_count(), state.batches, state.over_block_limit) == (3, 1, 1)
    state.apply(decode_frames([b"", (2).to_bytes(8, "big"), encode([cleared(), stored([6, 7, 8, 9], None, range(64))],
                                                                    "vllm-array")]), "e")
    assert state.block_count() == 4 and state.summary()["blocks"] == 4


@pytest.fixture
def silent_replay():
    """A replay endpoint that takes requests and never answers them."""
    context = zmq.Context()
    deaf = context.socket(zmq.ROUTER)
    deaf.setsockopt(zmq.LINGER, 0)
    deaf.bind("tcp://127.0.0.1:0")
    yield deaf.getsockopt(zmq.LAST_ENDPOINT).decode()
    deaf.close(linger=0)
    context.term()


@pytest.mark.parametrize("replay", ["engine", "none", "silent"])
def test_a_sequence_number_far_ahead_is_a_restart_never_a_reason_to_drop_later_batches(replay, silent_replay):
    with KvEventTestPublisher(replay_endpoint="tcp://127.0.0.1:0" if replay == "engine" else None) as pub:
        replay_endpoint = {"engine": pub.replay_endpoint, "none": None, "silent": silent_replay}[replay]
        with KvEventWatcher([pub.endpoint], [replay_endpoint], replay_timeout_ms=300) as watcher:
            assert pub.wait_for_subscriber(JOIN_TIMEOUT_S)
            if replay != "none":
                watch_until(watcher, lambda s: s.history_fetches + s.history_failures == 1, "the history on connecting")
            pub.publish([stored([1], None, range(16))])
            watch_until(watcher, lambda s: s.batches == 1, "batch 0")
            bogus = 1 << 63
            pub.pub.send_multipart([pub.topic, bogus.to_bytes(8, "big"), msgpack.packb([1.0, [], 0])])
            pub.publish([stored([2], 1, range(16))])
            last = pub.publish([stored([3], 2, range(16))])
            watch_until(watcher, lambda s: s.find(0, f"{3:016x}") is not None, "the batches after the bogus one")
            state = watcher.state
            assert state.find(0, f"{2:016x}") is not None and state.last_seq == {pub.endpoint: last}
            jump = next(n for n in state.notices if "sequence jumped" in n)
            assert f"from 0 to {bogus:,}" in jump and f"more than {MAX_SEQ_JUMP:,}" in jump
            assert "publisher restart" in jump and state.seq_jumps >= 1
            assert f"notice: {jump}" in format_table({**state.summary(), "endpoints": [pub.endpoint], "seconds": 1.0})
            if replay == "engine":  # the engine's replay does not hold it: refused, the position never moved
                assert state.refused == 1 and any(f"seq {bogus:,}" in r for r in state.refusals), list(state.refusals)
                assert "which does not hold it: refused" in jump


# Payloads of the decoder's limit shaped to cost the most per byte, decoded under tracemalloc
# in a child: (name, size, peak bytes, outcome) each.
SHAPES = """
import json, tracemalloc
from engine.adapters.kv_event_decode import MAX_PAYLOAD_BYTES, KvEventError, decode_payload

def array(n):
    return b"\\xdd" + n.to_bytes(4, "big")

def filled(element, per):  # an array of arrays of `per` elements, as many as the limit holds
    count = (MAX_PAYLOAD_BYTES - 16) // (5 + per * len(element))
    return array(count) + (array(per) + element * per) * count

shapes = {"empty arrays": filled(b"\\x90", 500_000), "empty maps": filled(b"\\x80", 500_000),
          "arrays of an empty array": filled(b"\\x91\\x90", 500_000),
          "2-character strings": filled(b"\\xa2ab", 500_000),
          "fixints": filled(b"\\x01", 500_000), "uint32s": filled(b"\\xce\\x00\\x01\\x00\\x00", 400_000)}
for name, payload in shapes.items():
    tracemalloc.start()
    try:
        decode_payload(payload, 1)
        outcome = "decoded"
    except KvEventError as exc:
        outcome = str(exc)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(json.dumps([name, len(payload), peak, outcome]), flush=True)
"""


def test_what_one_payload_builds_is_bounded_whatever_its_shape():
    """Empty containers cost ~70 bytes of Python objects per byte of msgpack: a 2 MiB payload of
    them built 126-141 MiB before the decoder counted what it builds (and payloads of 64 MiB
    were let in). Now it stops at MAX_DECODED_ITEMS: at most ~22 times the payload."""
    out = subprocess.run([sys.executable, "-c", SHAPES], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                         check=False)
    assert out.returncode == 0, out.stderr
    for name, size, peak, outcome in map(json.loads, out.stdout.splitlines()):
        print(f"{name}: {size / 2**20:.2f} MiB -> peak {peak / 2**20:.1f} MiB ({outcome[:60]})")
        assert peak < 32 * size, f"{name}: {size:,} bytes built {peak:,} bytes ({outcome})"
