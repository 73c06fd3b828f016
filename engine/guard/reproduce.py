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

from engine.client.local_server import LocalServer, write_config
from engine.config import EngineConfig
from engine.guard.scenarios import SCENARIOS, Scenario, config_sections, defences_for
from engine.wire.alert_kinds import DETECTORS, ISOLATION_KINDS
from engine.wire.protocol import CANARY_TENANT

POLL_S = 2.0  # how often a slow answer makes us check the engine is still alive
FRAGMENT = 6  # marker characters in a row that count as its text leaking (36**6 = 2.2e9 strings)
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
    reader_ids: list = field(default_factory=list)  # the readers of the ground truth
    leaks: list = field(default_factory=list)  # another request's marker text in an output
    detected: dict = field(default_factory=dict, repr=False)  # detector -> request ids
    passed: bool = True
    why: str = ""

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "detected"}


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
    ends = run_workload(client, work, alive)
    ids = [end.get("request_id") for end in ends]
    time.sleep(SETTLE_S)
    end = time.time()
    truth = [r for r in client.call("ground_truth")["reads"] if start <= r["time"] <= end]
    pairs = client.call("scope", since=start, until=end)["pairs"]
    # every request the ground truth names is scored, not only the workload's: a canary the
    # engine schedules on its own may read (or be read) in the row's window, and leaving it
    # out made its detection invisible to the table (one missed reader, depending on timing)
    named = {r["reader"] for r in truth} | {r.get("source") for r in truth} | {p["reader"] for p in pairs}
    audits = {rid: client.audit(rid)["events"] for rid in [*ids, *sorted(n for n in named - set(ids) if n)]}
    touched = {rid for rid, w in zip(ids, work) if _fault_touched(scenario, w)}
    touched |= {rid for rid in audits if rid not in ids and _fault_touched(scenario, {"tenant": CANARY_TENANT})}
    result = _tabulate(scenario, row, ids, truth, pairs, audits, touched)
    result.leaks = marker_leaks(ids, work, ends)
    result.passed, result.why = _verdict(scenario, row, result, result.detected)
    return result


def marker_leaks(ids: list[str], work: list[dict], ends: list[dict]) -> list[dict]:
    """Black-box evidence: a piece of another request's marker in an output. A piece counts
    when it is at least FRAGMENT characters long, is not in the reader's own prompt and names
    one source only (found in no other request's marker). One entry per (reader, source)
    pair, with the longest piece seen."""
    markers = {rid: w["marker"] for rid, w in zip(ids, work) if w.get("marker") and rid}
    prompts = {rid: bytes(t for t in w["prompt_ids"] if t < 256).decode("latin-1") for rid, w in zip(ids, work)}
    leaks = []
    for reader, end in zip(ids, ends):
        text = bytes(t for t in end.get("token_ids") or [] if t < 256).decode("latin-1")
        for source, secret in markers.items():
            if source == reader:
                continue
            piece = _longest_piece(secret, text)
            if (len(piece) >= min(FRAGMENT, len(secret)) and piece not in prompts.get(reader, "")
                    and not any(piece in other for rid, other in markers.items() if rid != source)):
                leaks.append({"reader": reader, "source": source, "marker": secret, "seen": piece,
                              "whole": piece == secret})
    return leaks


def _longest_piece(secret: str, text: str) -> str:
    """The longest substring of `secret` found in `text` (markers are 24-40 characters)."""
    best = ""
    for i in range(len(secret)):
        for j in range(len(secret), i + len(best), -1):
            if secret[i:j] in text:
                best = secret[i:j]
                break
    return best


def run_workload(client, work: list[dict], alive=lambda: None) -> list[dict]:
    """Submit everything at once (concurrency is what the faults need), or wave by wave where
    the work names waves (`wave`: a later wave starts when the one before has ended, e.g. to
    find what it cached); wait for every end. Returns each request's last message (`done` or
    `error` header), in order. A dead engine is reported within POLL_S; a live one that stops
    answering, after the client's timeout."""
    ends = []
    for wave in sorted({fields.get("wave", 0) for fields in work}):
        streams = [client.submit(stream=False, **{k: v for k, v in fields.items() if k not in ("marker", "wave")})
                   for fields in work if fields.get("wave", 0) == wave]
        ends += [_wait_end(client, stream, alive) for stream in streams]
    return ends


def _wait_end(client, stream, alive) -> dict:
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
            return {**msg.header, "request_id": rid}


def _fault_touched(scenario: Scenario, fields: dict) -> bool:
    """Requests a fault acts on directly: any detection on them is expected, not false."""
    if not scenario.faults:
        return False
    return not scenario.tenant or fields.get("tenant") == scenario.tenant


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
    result.detected, result.reader_ids = detected, sorted(readers)
    return result


def _verdict(scenario: Scenario, row: str, r: RowResult, detected: dict) -> tuple[bool, str]:
    if not r.scope_equal:
        return False, "incident scoping differs from the ground truth"
    if row == "all on" and r.reads:
        return False, f"{r.reads} cross-request reads with every defence on"
    if row == "all on" and r.leaks:
        return False, f"{len(r.leaks)} output(s) carry another request's marker with every defence on"
    leaked_unseen = {leak["reader"] for leak in r.leaks} - set(r.reader_ids)
    if leaked_unseen:
        return False, f"marker text crossed to {sorted(leaked_unseen)} without a recorded cross read"
    if r.missed:
        return False, f"{r.missed} reader(s) of other requests' data went undetected"
    if r.false_positives:
        return False, f"{r.false_positives} false positive(s)"
    if not scenario.faults and any(detected.get(k) for k in ISOLATION_KINDS):
        return False, "alerts on a clean run"
    return True, ""


def format_table(name: str, results: list[RowResult], examples: int = 3) -> str:
    head = ("| defences | requests | cross reads (readers) | caught by | missed | prevented | false positives "
            "| scope = truth | marker text in another's output | verdict |\n"
            "|---|---:|---:|---|---:|---:|---:|---|---|---|")
    lines = [f"### {name}", "", head]
    for r in results:
        caught = ", ".join(f"{k} {v}" for k, v in r.caught.items() if v) or "—"
        whole = sum(1 for leak in r.leaks if leak["whole"])
        leaks = f"{len(r.leaks)} pair(s), {whole} whole marker(s)" if r.leaks else "none"
        lines.append(f"| {r.row} | {r.requests} | {r.reads} ({r.readers}) | {caught} | {r.missed} | "
                     f"{r.prevented} | {r.false_positives} | {'yes' if r.scope_equal else 'NO'} | {leaks} | "
                     f"{'pass' if r.passed else 'FAIL: ' + r.why} |")
    shown = [(r.row, leak) for r in results for leak in r.leaks][:examples]
    if shown:
        lines.append("")
        lines += [f"- {row}: the output of {leak['reader']} carries {leak['source']}'s marker "
                  f"`{leak['marker']}` as `{leak['seen']}`" for row, leak in shown]
    return "\n".join(lines)
