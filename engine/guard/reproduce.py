"""Run a scenario end to end on real worker processes and tabulate what happened.

For each row (all defences on, then each defence off alone) on one running server:
requests sent; cross-request reads that really happened (ground truth: each decode worker's
own list, from per-token provenance); for the readers among them, which detectors caught
them; readers no detector caught; requests a defence stopped; false positives; and whether
the supervisor's incident scoping for the row's time window equals the ground truth.
"""

from __future__ import annotations

import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine.commands.local_server import LocalServer, write_config
from engine.config import EngineConfig
from engine.guard.scenarios import SCENARIOS, Scenario, config_sections, defences_for

DETECTORS = ("ownership_violation", "transfer_mismatch", "late_write_landed", "late_write_dropped",
             "canary_leak", "canary_marker_in_output", "admission_rejected", "transfer_timeout")
ISOLATION_ALERTS = tuple(d for d in DETECTORS if d != "admission_rejected")
POLL_S = 2.0  # how often a slow answer makes us check the engine is still alive
SETTLE_S = 0.6  # let the decode workers' last isolation reports reach the supervisor


@dataclass
class RowResult:
    row: str
    requests: int
    reads: int  # distinct (reader, pool, page, source) cross-request reads that happened
    readers: int
    caught: dict[str, int] = field(default_factory=dict)  # detector -> readers it caught
    missed: int = 0
    prevented: int = 0
    false_positives: int = 0
    scope_equal: bool = True
    pairs: list = field(default_factory=list)
    passed: bool = True
    why: str = ""

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def run_scenario(name: str, *, scale: float = 1.0, seed: int | None = None, base: EngineConfig | None = None,
                 workdir: Path | None = None, log=print) -> list[RowResult]:
    """Start a server with the scenario's faults, run every row, stop the server."""
    scenario = SCENARIOS[name]
    seed = random.randrange(2**31) if seed is None else seed
    workdir = workdir or Path(tempfile.mkdtemp(prefix=f"pw-{name}-"))
    base = base or EngineConfig().replace(canaries={"enabled": False})
    server = LocalServer(write_config(workdir / "config.toml", base, **config_sections(scenario)), "--allow-faults")
    try:
        client = server.client(timeout_s=300)
        server.wait_workers(client)
        results = []
        for i, row in enumerate(scenario.rows):
            client.reconfigure({"defences": defences_for(row)}, apply=True)
            results.append(run_row(client, scenario, row, random.Random(seed + i), scale, alive=server.check_alive))
            log(f"  {name}: {row}: {results[-1].reads} cross reads, "
                f"{'pass' if results[-1].passed else 'FAIL: ' + results[-1].why}")
        return results
    finally:
        server.stop()


def run_row(client, scenario: Scenario, row: str, rng: random.Random, scale: float,
            alive=lambda: None) -> RowResult:
    """alive(): raises when the engine is gone (checked whenever an answer is slow to come)."""
    start = time.time()
    work = scenario.workload(rng, scale)
    ids = run_workload(client, work, alive)
    time.sleep(SETTLE_S)
    end = time.time()
    truth = [r for r in client.call("ground_truth")["reads"] if start <= r["time"] <= end]
    pairs = client.call("scope", since=start, until=end)["pairs"]
    audits = {rid: client.audit(rid)["events"] for rid in ids}
    touched = {rid for rid, w in zip(ids, work) if _fault_touched(scenario, w)}
    return _tabulate(scenario, row, ids, truth, pairs, audits, touched)


def run_workload(client, work: list[dict], alive=lambda: None) -> list[str]:
    """Submit everything at once (concurrency is what the faults need); wait for every end.
    A dead engine is reported within POLL_S; a live one that stops answering, after the
    client's own timeout."""
    streams = [client.submit(stream=False, **fields) for fields in work]
    ids = []
    for stream in streams:
        rid, quiet = None, 0.0
        while True:
            try:
                msg = client.recv_for(stream, POLL_S)
            except TimeoutError:
                alive()
                quiet += POLL_S
                if quiet >= client.timeout_s:
                    raise TimeoutError(f"request {rid or '(not accepted yet)'} got no answer within "
                                       f"{client.timeout_s:.0f} s while the engine is running") from None
                continue
            quiet = 0.0
            rid = msg.get("request_id") or rid
            if msg.op in ("done", "error"):
                break
        ids.append(rid)
    return ids


def _fault_touched(scenario: Scenario, fields: dict) -> bool:
    """Requests a fault acts on directly: any detection on them is expected, not false."""
    if not scenario.faults:
        return False
    if scenario.faults.get("placeholder_on_reject"):
        return fields.get("tenant") == "over-long"
    return True


def _tabulate(scenario, row, ids, truth, pairs, audits, touched) -> RowResult:
    reads = {(r["reader"], r["pool"], r["page"], r["source_slot"]) for r in truth}
    readers = {r["reader"] for r in truth}
    detected: dict[str, set[str]] = {}
    prevented, flagged = set(), set()
    for rid, events in audits.items():
        for event in events:
            kind = event["event"].removeprefix("alert:")
            if kind not in DETECTORS or event.get("role") == "source" or not event["event"].startswith("alert:"):
                continue
            detected.setdefault(kind, set()).add(rid)
            if event.get("prevented"):
                prevented.add(rid)
            if kind != "admission_rejected" or not event.get("prevented"):
                flagged.add(rid)
    caught = {kind: len(rids & readers) for kind, rids in sorted(detected.items())}
    missed = len([r for r in readers if not any(r in rids for rids in detected.values())])
    false_pos = len([r for r in flagged if r not in readers and r not in touched])
    scoped = {(p["reader"], pool, page, p["source_slot"]) for p in pairs for pool, page in p["pages"]}
    result = RowResult(row, len(ids), len(reads), len(readers), caught, missed, len(prevented), false_pos,
                       scoped == {(a, b, c, d) for a, b, c, d in reads}, pairs)
    result.passed, result.why = _verdict(scenario, row, result, detected)
    return result


def _verdict(scenario: Scenario, row: str, r: RowResult, detected: dict) -> tuple[bool, str]:
    if not r.scope_equal:
        return False, "incident scoping differs from the ground truth"
    if row == "all on" and r.reads:
        return False, f"{r.reads} cross-request reads with every defence on"
    if r.missed:
        return False, f"{r.missed} reader(s) of other requests' data went undetected"
    if r.false_positives:
        return False, f"{r.false_positives} false positive(s)"
    if not scenario.faults and any(detected.get(k) for k in ISOLATION_ALERTS):
        return False, "alerts on a clean run"
    return True, ""


def format_table(name: str, results: list[RowResult]) -> str:
    head = ("| defences | requests | cross reads (readers) | caught by | missed | prevented | false positives "
            "| scope = truth | verdict |\n|---|---:|---:|---|---:|---:|---:|---|---|")
    lines = [f"### {name}", "", head]
    for r in results:
        caught = ", ".join(f"{k} {v}" for k, v in r.caught.items() if v) or "—"
        lines.append(f"| {r.row} | {r.requests} | {r.reads} ({r.readers}) | {caught} | {r.missed} | "
                     f"{r.prevented} | {r.false_positives} | {'yes' if r.scope_equal else 'NO'} | "
                     f"{'pass' if r.passed else 'FAIL: ' + r.why} |")
    return "\n".join(lines)
