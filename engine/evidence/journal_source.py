"""JournalSource: the engine's read-only control ops answered from the journal alone.

`collect()` (the snapshot exporter) takes it in place of an EngineClient, so a bundle can be
built after the engine died or restarted: `main.py snapshot --journal FILE`. Page maps come from
the journal's keyframes (the newest at or before the window's end), since the pools themselves
are gone.
"""

from __future__ import annotations

from pathlib import Path

from engine.evidence.journal_read import JournalError, JournalReader
from engine.evidence.keyframe_arrays import read_keyframe

NO_KEYFRAME = "no keyframe in the journal"
FIRST_KEYFRAMES = 16  # keyframes a `history` answer carries (the window's first: the first crossings)
COUNTED = ("admitted", "rejected", "placeholder", "finished", "failed", "cancelled")


class JournalSource:
    def __init__(self, path: str | Path, run: str | None = None):
        """All runs in the journal, or only `run`. Raises JournalError naming the file or run."""
        self.reader = JournalReader(path)
        runs = self.reader.runs()
        if not runs:
            raise JournalError(f"{path} holds no engine run")
        if run is not None:
            runs = [r for r in runs if r["run"] == run]
            if not runs:
                raise JournalError(f"{path} holds no run {run!r}; runs: "
                                   + ", ".join(r["run"] for r in self.reader.runs()))
        self.runs = runs
        self.run_ids = [r["run"] for r in runs]
        newest = runs[-1]
        self.until = max((r["ended"] or r["last_write"] or r["started"]) for r in runs) + 1.0
        self.newest = newest

    def close(self) -> None:
        self.reader.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- the client's interface, as collect() uses it ------------------------------------
    def status(self) -> dict:
        reader, runs, newest = self.reader, self.run_ids, self.newest
        first = self.runs[0]["started"]
        engine = {**newest["engine"], "control": newest["control"], "hostname": newest["host"],
                  "started": newest["started"], "time": self.until, "uptime_s": self.until - first,
                  "run": newest["run"], "runs": [{k: r[k] for k in ("run", "started", "ended", "clean")}
                                                 for r in self.runs],
                  "source": "journal", "journal": str(reader.path)}
        workers = reader.latest("workers", "workers", runs) or []
        pools = reader.keyframe_pools(self.until, runs)
        for worker in workers:
            if (worker.get("pool") or {}).get("name") not in pools:
                worker["state"] = NO_KEYFRAME
        counters = reader.event_counts(COUNTED, self.until, runs)
        alerts = [a if a["run"] == newest["run"] else
                  {**a, "previous_run": True, "journal_key": a["key"], "key": f"{a['run']}/{a['key']}"}
                  for a in reader.alerts(runs)]  # the newest run's keys as the live engine gives them
        return {"engine": engine, "workers": workers, "alerts": alerts,
                "capacity": reader.latest("findings", "findings", runs) or [], "config": newest["config"],
                "counters": counters, "evidence": {"journal": str(reader.path), "runs": engine["runs"],
                                                          "prunes": reader.prunes()}}

    def call(self, op: str, **kw) -> dict:
        since, until = kw.get("since"), kw.get("until")
        if op == "history":
            history = self.reader.history(since, until, self.run_ids)
            return {**history, "since": since, "until": until or self.until, "next": None, "telemetry": [],
                    "keyframes": self.keyframes(since, until),
                    "keyframes_left_out": max(0, self.count_keyframes(since, until) - FIRST_KEYFRAMES)}
        if op == "scope":
            pairs = self.reader.scope(since, until, self.run_ids)
            return {"pairs": pairs, "reads": sum(p["reads"] for p in pairs), "since": since, "until": until,
                    "incomplete_before": None, "dropped_reads": 0}
        if op == "prompt_log":
            entries = self.reader.prompt_log(since, self.run_ids)
            return {"entries": entries, "total": len(entries), "left_out": 0}
        raise JournalError(f"the journal cannot answer {op!r}")

    def count_keyframes(self, since: float | None = None, until: float | None = None) -> int:
        return self.reader.count_keyframes(since, until, self.run_ids)

    def page_metadata(self, pool: str) -> dict:
        arrays = self.reader.latest_keyframe(pool, self.until, self.run_ids)
        if arrays is None:
            raise JournalError(f"the journal holds no keyframe of pool {pool!r}")
        return read_keyframe(arrays, f"the journal's latest keyframe of pool {pool!r}")

    def keyframes(self, since: float | None = None, until: float | None = None,
                  first: int | None = FIRST_KEYFRAMES) -> list[dict]:
        """The window's first `first` keyframes with their arrays decoded (the first-crossing maps)."""
        out = []
        for frame in self.reader.keyframes(since, until, self.run_ids, limit=first):
            arrays = read_keyframe(frame["arrays"], f"the journal's keyframe of pool {frame.get('pool')!r} at "
                                                    f"{frame.get('time')}")
            out.append({**{k: v for k, v in frame.items() if k != "arrays"},
                        **{name: a.tolist() for name, a in arrays.items()}})
        return out
