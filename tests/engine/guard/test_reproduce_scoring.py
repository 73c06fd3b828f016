"""`reproduce` scores every reader the ground truth names, not only the workload's requests.

The one-in-three miss of issue 12 (`stale-block-table`, writer-tag check off): a canary the
engine scheduled on its own read another request's data during the row; the engine caught it,
but the table fetched the audits of the workload's requests only and counted the canary as a
reader nobody caught. Whether a canary overlapped the faulty requests was a matter of timing.
This replays that row through a scripted client, so it fails or passes the same way every run.
"""

from __future__ import annotations

import random
import time
from types import SimpleNamespace

from engine.guard.reproduce import run_row
from engine.guard.scenarios import SCENARIOS


class ScriptedClient:
    """Answers run_row's calls as the engine did in the failing run: two workload requests,
    both read another's data and were caught; a canary read r1's data and was caught too."""

    timeout_s = 5.0

    def __init__(self):
        self.ids = iter(["r1", "r2", "r3"])
        self.now = time.time()

    def submit(self, stream=False, **fields):
        self.now = time.time()  # the reads happen while the row runs
        return next(self.ids)

    def recv_for(self, stream, timeout_s):
        return SimpleNamespace(op="done", header={"op": "done", "token_ids": []}, get=lambda k, d=None: stream)

    def call(self, op, **fields):
        if op == "ground_truth":
            t = self.now
            return {"reads": [
                {"reader": "r2", "pool": "decode-0", "page": 7, "source_slot": 1, "source": "r1", "time": t},
                {"reader": "r3", "pool": "decode-0", "page": 8, "source_slot": 2, "source": "r2", "time": t},
                {"reader": "canary-9", "pool": "decode-0", "page": 7, "source_slot": 1, "source": "r1", "time": t},
            ]}
        if op == "scope":
            return {"pairs": [
                {"reader": "r2", "source_slot": 1, "pages": [["decode-0", 7]]},
                {"reader": "r3", "source_slot": 2, "pages": [["decode-0", 8]]},
                {"reader": "canary-9", "source_slot": 1, "pages": [["decode-0", 7]]},
            ]}
        raise AssertionError(op)

    def audit(self, request_id):
        caught = {"event": "alert:ownership_violation", "prevented": False}
        return {"events": [caught] if request_id in ("r2", "r3", "canary-9") else []}


def test_a_canary_that_read_foreign_data_is_scored_with_its_own_audit(monkeypatch):
    monkeypatch.setattr("engine.guard.reproduce.SETTLE_S", 0.0)
    scenario = SCENARIOS["stale-block-table"]
    monkeypatch.setattr(scenario, "workload", lambda rng, scale: [
        {"prompt_ids": [256, 1], "marker": "a" * 24}, {"prompt_ids": [256, 2], "marker": "b" * 24},
        {"prompt_ids": [256, 3], "marker": "c" * 24}])
    result = run_row(ScriptedClient(), scenario, "writer_tag_check off", random.Random(1), 0.25)
    assert result.readers == 3 and result.reader_ids == ["canary-9", "r2", "r3"]
    assert result.missed == 0 and result.caught == {"ownership_violation": 3}, result
    assert result.passed, result.why
