"""CrossingWatch (Qt-free): what is new, what the operator acknowledged, a new engine."""

from __future__ import annotations

from gui.model.crossings import CrossingWatch


def _pair(seq, t, reader="r2", source="r1", rt="tenant-b", st="tenant-a"):
    return {"seq": seq, "time": t, "reader": reader, "source": source, "reader_tenant": rt, "source_tenant": st,
            "reader_slot": 2, "source_slot": 1}


def test_new_pairs_are_announced_once_and_acknowledge_lasts_until_the_next():
    watch = CrossingWatch()
    assert watch.update({"pairs": 0, "reads": 0, "recent": []}, "e1") == [] and watch.lines() == []
    new = watch.update({"pairs": 1, "reads": 5, "recent": [_pair(1, 100.0)]}, "e1")
    assert [c.seq for c in new] == [1] and watch.unacknowledged == 1
    assert watch.update({"pairs": 1, "reads": 9, "recent": [_pair(1, 100.0)]}, "e1") == []  # announced already
    lines = watch.lines()
    assert "1 new pair(s)" in lines[0] and "9 cross reads" in lines[0]
    assert "tenant tenant-b received tenant tenant-a's data" in lines[1]
    assert "r2 (tenant tenant-b) received data of r1 (tenant tenant-a)" in lines[2]
    watch.acknowledge()
    assert watch.unacknowledged == 0 and watch.lines() == []
    new = watch.update({"pairs": 3, "reads": 20, "recent": [_pair(1, 100.0), _pair(2, 101.0, reader="r3"),
                                                            _pair(3, 102.0, reader="r4")]}, "e1")
    assert [c.seq for c in new] == [2, 3] and watch.unacknowledged == 2 and watch.last_new_at == 102.0


def test_more_new_pairs_than_listed_still_announce_one_and_a_new_engine_counts_anew_keeping_the_unacknowledged():
    watch = CrossingWatch()
    watch.update({"pairs": 2, "recent": [_pair(1, 1.0), _pair(2, 2.0)]}, "e1")
    watch.acknowledge()
    new = watch.update({"pairs": 500, "recent": [_pair(2, 2.0)]}, "e1")  # the list kept an old one only
    assert len(new) == 1 and watch.unacknowledged == 498
    new = watch.update({"pairs": 1, "recent": [_pair(1, 5.0, reader="x")]}, "e2")  # restarted engine
    # its count starts at 0, but the 498 pairs nobody acknowledged before the restart still stand
    assert [c.reader for c in new] == ["x"] and watch.unacknowledged == 499
    lines = watch.lines()
    assert "498 unacknowledged from before the engine restarted" in lines[0]
    assert any(line.startswith("x (tenant") for line in lines) and any(line.startswith("r2 (tenant") for line in lines)
    watch.acknowledge()
    assert watch.unacknowledged == 0 and watch.lines() == []
    watch.update({"pairs": 1, "recent": [_pair(1, 5.0, reader="y")]}, "e3")  # acknowledged: nothing carried
    assert watch.unacknowledged == 1 and "before the engine restarted" not in watch.lines()[0]


def test_malformed_entries_are_skipped():
    watch = CrossingWatch()
    new = watch.update({"pairs": 2, "recent": [{"seq": "x"}, _pair(2, 3.0)]}, None)
    assert [c.seq for c in new] == [2]
    assert watch.update("not a dict") == []
