"""CoreShare: a worker computing alone takes every core, workers computing together divide
them, an idle or stale worker gives its share back; and a real worker takes its share before
each layer of a real forward pass and gives it back when it goes idle."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from engine.config import CORE_SLOTS, MAX_WORKERS_PER_ROLE, WORKER_ROLES, core_slot
from engine.model.cpu_linear import pack_linears, packing_available, projection_weights
from engine.model.layers import DecoderLayer
from engine.workers.core_share import CHECK_S, FILE_NAME, SHARE_MIN_BYTES, STALE_S, CoreShare, worth_sharing
from tests.engine.workers.conftest import submit_prefill

SLOTS = CORE_SLOTS


class Recorder:
    def __init__(self):
        self.calls: list[int] = []

    def __call__(self, n: int) -> None:
        self.calls.append(n)


def share(tmp_path, slot: int, cores: int = 4) -> tuple[CoreShare, Recorder]:
    rec = Recorder()
    return CoreShare(tmp_path, slot, SLOTS, cores, set_threads=rec), rec


def test_alone_a_worker_takes_every_core_and_with_others_an_equal_part(tmp_path):
    a, rec_a = share(tmp_path, 0)
    b, rec_b = share(tmp_path, 64)
    c, _ = share(tmp_path, 65)
    now = time.monotonic()
    assert a.computing(now) == 4 and rec_a.calls == [4]
    assert b.computing(now) == 2  # a computes: b takes half
    assert a.computing(now + 2 * CHECK_S) == 2  # and a, at its next check, gives half up
    c.computing(now + 2 * CHECK_S)
    # three on four cores: the spare core to the lowest slot, never more than the cores
    assert [w.computing(now + 4 * CHECK_S) for w in (a, b, c)] == [2, 1, 1]
    assert rec_a.calls == [4, 2]  # set only when the share changes
    b.idle()
    c.idle()
    assert a.computing(now + 6 * CHECK_S) == 4
    assert rec_b.calls == [2, 1]


def test_a_mark_older_than_stale_s_is_a_dead_worker_and_not_counted(tmp_path):
    a, _ = share(tmp_path, 0, cores=2)
    b, _ = share(tmp_path, 1, cores=2)
    now = time.monotonic()
    b.computing(now)  # a long layer (a 4,096-token prefill) marks nothing for seconds ...
    assert a.computing(now + 10.0) == 1  # ... and still computes; then b dies without going idle
    assert a.computing(now + STALE_S + 0.1) == 2


def test_the_others_are_read_at_most_every_check_s(tmp_path):
    a, rec = share(tmp_path, 0, cores=2)
    b, _ = share(tmp_path, 1, cores=2)
    now = time.monotonic()
    a.computing(now)
    b.computing(now)
    assert a.computing(now + CHECK_S / 2) == 2  # not read yet
    assert a.computing(now + 2 * CHECK_S) == 1
    assert rec.calls == [2, 1]


def test_the_cores_left_over_go_to_the_lowest_slots(tmp_path):
    now = time.monotonic()
    for cores, slots, want in [(3, (5, 9), [2, 1]), (8, (0, 1, 70), [3, 3, 2]), (2, (0, 1, 2), [1, 1, 1])]:
        folder = tmp_path / f"{cores}-{len(slots)}"
        folder.mkdir()
        shares = [share(folder, slot, cores=cores)[0] for slot in slots]
        for s in shares:
            s._marks[s.slot] = now
        got = [s.share(now) for s in shares]
        assert got == want
        assert sum(got) == max(cores, len(slots))  # every core used, never more (at least one each)


def test_a_worker_restarted_in_a_slot_clears_the_mark_its_predecessor_left(tmp_path):
    dead, _ = share(tmp_path, 7, cores=2)
    other, _ = share(tmp_path, 8, cores=2)
    now = time.monotonic()
    dead.computing(now)  # ... and dies computing
    assert other.share(now) == 1
    share(tmp_path, 7, cores=2)  # its restart
    assert other.share(now) == 2


def test_one_core_is_never_divided_below_one_thread(tmp_path):
    a, _ = share(tmp_path, 0, cores=1)
    b, _ = share(tmp_path, 1, cores=1)
    now = time.monotonic()
    b.computing(now)
    assert a.computing(now) == 1


def test_the_file_is_private_and_close_gives_the_share_back(tmp_path):
    a, _ = share(tmp_path, 3, cores=2)
    b, _ = share(tmp_path, 4, cores=2)
    now = time.monotonic()
    a.computing(now)
    assert b.others_computing(now) == 1
    a.close()
    assert b.others_computing(now) == 0
    assert (tmp_path / FILE_NAME).stat().st_mode & 0o077 == 0
    assert (tmp_path / FILE_NAME).stat().st_size == SLOTS * 8


def test_every_worker_a_supervisor_can_hold_has_its_own_slot_in_the_file():
    slots = [core_slot(role, i) for role in WORKER_ROLES for i in range(MAX_WORKERS_PER_ROLE)]
    assert sorted(slots) == list(range(CORE_SLOTS))
    with pytest.raises(ValueError, match=f"worker index {MAX_WORKERS_PER_ROLE} is out of range"):
        core_slot("decode", MAX_WORKERS_PER_ROLE)


@pytest.mark.parametrize("slot, cores, message", [
    (CORE_SLOTS, 2, f"core-share slot {CORE_SLOTS} is out of range: must be between 0 and {CORE_SLOTS - 1}"),
    (-1, 2, "core-share slot -1 is out of range"),
    (0, 0, "core-share cores 0 must be at least 1"),
])
def test_bad_slots_and_core_counts_are_refused_by_name(tmp_path, slot, cores, message):
    with pytest.raises(ValueError, match=message):
        CoreShare(tmp_path, slot, SLOTS, cores)


def test_a_real_worker_takes_its_share_before_its_first_layer_and_gives_it_back_when_idle(
        shared_prefill_rig, tmp_path, monkeypatch):
    bus, kv, kv_endpoint, worker = shared_prefill_rig
    assert worker.cores is not None  # CPU and `workers.threads` 0: the cores are shared
    worker.cores.close()
    worker.cores = CoreShare(tmp_path, 0, SLOTS, 4)  # four cores, whatever this machine has (torch allows it)
    seen = []  # the threads each layer ran with
    real = DecoderLayer.forward

    def forward(self, *args, **kwargs):
        seen.append(torch.get_num_threads())
        return real(self, *args, **kwargs)

    monkeypatch.setattr(DecoderLayer, "forward", forward)
    layers = len(worker.engine.model.decoder.model.layers)
    decode, _ = share(tmp_path, 64)
    torch.set_num_threads(1)
    decode.computing()  # a decode worker computes: the prefill takes half, from its first layer on
    submit_prefill(worker, kv_endpoint, "first", 1, [10, 11])
    worker.work()
    assert seen == [2] * layers
    assert decode.others_computing(time.monotonic()) == 1  # marked while it computed ...
    assert not worker.computes_next()  # its one job is prefilled: shipping computes nothing
    worker._cores_after_work()
    assert decode.others_computing(time.monotonic()) == 0  # ... and idle once the loop sees it done

    decode.idle()
    seen.clear()
    submit_prefill(worker, kv_endpoint, "second", 2, [12, 13])
    worker.cores._checked = -1.0  # the second forward may come sooner than CHECK_S
    worker.work()
    assert seen == [4] * layers  # alone now: every core


def test_the_copy_models_worker_keeps_a_fixed_part_of_the_cores(prefill_rig):
    worker = prefill_rig[3]
    assert 4 * projection_weights(worker.engine.model.decoder) < SHARE_MIN_BYTES  # 2.4 MiB
    assert worker.cores is None
    assert worker.hello().threads_shared is False


def test_worth_sharing_counts_every_projection_plain_or_packed_and_nothing_else():
    side = 1024  # a 1024 x 1024 float32 weight: 4 MiB; SHARE_MIN_BYTES is two of them
    assert SHARE_MIN_BYTES == 2 * side * side * 4
    two = nn.Sequential(nn.Linear(side, side, bias=False), nn.Linear(side, side, bias=False))
    assert worth_sharing(two)
    assert worth_sharing(two.to(torch.bfloat16))  # counted as float32: the same shape, the same rule
    assert not worth_sharing(nn.Sequential(nn.Linear(side, side), nn.Linear(side, side - 1)))
    assert not worth_sharing(nn.Sequential(nn.Embedding(2 * side, side), nn.Linear(8, 8)))  # a lookup, not a product
    if packing_available():
        packed = nn.Sequential(nn.Linear(side, side), nn.Linear(side, side))
        assert pack_linears(packed, min_bytes=0) == 2 and worth_sharing(packed)


def test_a_prefill_worker_waiting_for_free_pages_computes_nothing(prefill_rig, tmp_path):
    bus, kv, kv_endpoint, worker = prefill_rig
    pool = worker.engine.pool
    held = pool.allocate(99, pool.free_pages)  # the pool is full: the job waits
    submit_prefill(worker, kv_endpoint, "waits", 1, [10, 11])
    worker.work()
    assert worker.jobs and worker.busy()
    assert not worker.computes_next()  # so the decode worker may have every core meanwhile
    pool.free(99, held.pages)
    worker.work()
    assert not worker.jobs


class FakeCpu:
    """process_time() of a process that gets `rate` cores of CPU per second of wall time."""

    def __init__(self):
        self.rate, self.cpu, self.wall = 2.0, 0.0, 0.0

    def at(self, wall: float) -> None:
        self.cpu += (wall - self.wall) * self.rate
        self.wall = wall

    def __call__(self) -> float:
        return self.cpu


def run_for(worker: CoreShare, cpu: FakeCpu, start: float, seconds: float) -> list[int]:
    """Compute for `seconds` of fake wall time, a layer every 10 ms: the threads at each layer."""
    threads = []
    for i in range(int(seconds / 0.01)):
        now = start + i * 0.01
        cpu.at(now)
        threads.append(worker.computing(now))
    return threads


def test_another_process_on_the_cores_makes_a_worker_compute_with_the_cores_it_gets(tmp_path):
    cpu = FakeCpu()
    rec = Recorder()
    worker = CoreShare(tmp_path, 0, SLOTS, 2, set_threads=rec, cpu_time=cpu)
    assert set(run_for(worker, cpu, 100.0, 1.0)) == {2}  # every thread ran: 2 cores of CPU per second
    cpu.rate = 1.3  # a busy process takes half of one core (measured: 1.21-1.29 cores with two threads)
    got = run_for(worker, cpu, 101.0, 1.0)
    assert got[:20] == [2] * 20 and got[-1] == 1  # one window of 0.25 s, then the cores it got
    assert worker.crowd.cap == 1 and rec.calls == [2, 1]
    cpu.rate = 1.0
    got = run_for(worker, cpu, 102.0, 1.2)  # one thread waits for nobody: no reading, the cap holds
    assert set(got) == {1}
    cpu.rate = 1.3
    got = run_for(worker, cpu, 103.2, 2.0)  # the cap ends 2 s after it began: a probe with both, still crowded
    assert 2 in got and got[-1] == 1 and worker.crowd.backoff == 8.0  # so the next cap lasts 4 s, then 8
    cpu.rate = 2.0  # the other process is gone
    got = run_for(worker, cpu, 105.2, 2.0)
    assert set(got) == {1}  # still within the 4 s cap
    got = run_for(worker, cpu, 107.2, 2.0)
    assert got[-1] == 2 and worker.crowd.cap is None and worker.crowd.backoff == 2.0


def test_idle_time_is_no_reading_and_a_quiet_machine_never_caps(tmp_path):
    cpu = FakeCpu()
    worker = CoreShare(tmp_path, 0, SLOTS, 2, set_threads=Recorder(), cpu_time=cpu)
    for start in range(100, 110):
        run_for(worker, cpu, float(start), 0.2)  # compute 0.2 s, then 0.8 s idle: no CPU used meanwhile
        cpu.rate = 0.0
        cpu.at(start + 1.0)
        cpu.rate = 2.0
        worker.idle()
    assert worker.crowd.cap is None and worker.threads == 2
