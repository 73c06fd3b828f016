"""Detector recall and precision over many seeds: every scenario, every defence row.

    python bench/detector_recall.py [--seeds 30] [--first-seed 1] [--scale 0.25] [--scenarios a,b]
                                    [--runs FILE] [--table-only]

Each seed runs `reproduce` of each scenario end to end (real server, real worker processes,
canaries on as in every scenario) and sums, per scenario and row: cross-request reads that
happened (ground truth), readers, readers caught, missed, false positives and whether incident
scoping equalled the ground truth in every run. Goal: missed = 0 and false positives = 0 over
every run. Exit status 1 when any run misses, raises a false positive or fails its row.

Every row of every run is appended to --runs (JSON lines) as soon as it is known, and a
(seed, scenario) already complete there is not run again: a long series (30 seeds take
hours on two cores) can stop and go on later, and --table-only prints the table of
what the file holds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.guard.reproduce import run_scenario  # noqa: E402
from engine.guard.scenarios import SCENARIOS  # noqa: E402


def load_runs(path: Path | None) -> list[dict]:
    if path is None or not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def table(runs: list[dict]) -> tuple[str, list[str]]:
    totals: dict[tuple[str, str], dict] = defaultdict(lambda: defaultdict(int))
    failures = []
    for r in runs:
        t = totals[(r["scenario"], r["row"])]
        t["runs"] += 1
        t["reads"] += r["reads"]
        t["readers"] += r["readers"]
        t["caught"] += r["readers"] - r["missed"]
        t["missed"] += r["missed"]
        t["false_positives"] += r["false_positives"]
        t["scope_differs"] += not r["scope_equal"]
        t["failed"] += not r["passed"]
        if not r["passed"]:
            failures.append(f"{r['scenario']} seed {r['seed']} {r['row']}: {r['why']}")
    seeds = sorted({r["seed"] for r in runs})
    lines = [f"{len(seeds)} seed(s) ({seeds[0] if seeds else '-'}..{seeds[-1] if seeds else '-'}), "
             f"{len({r['scenario'] for r in runs})} scenario(s), {len(runs)} row runs", "",
             "| scenario | defences | runs | cross reads | readers | caught | missed | false positives "
             "| scope = truth | failed rows |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    for (name, row), t in sorted(totals.items()):
        lines.append(f"| {name} | {row} | {t['runs']} | {t['reads']:,} | {t['readers']:,} | {t['caught']:,} | "
                     f"{t['missed']} | {t['false_positives']} | {'every run' if not t['scope_differs'] else 'NO'} "
                     f"| {t['failed']} |")
    lines += [f"- FAIL {line}" for line in failures]
    return "\n".join(lines), failures


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=30)
    p.add_argument("--first-seed", type=int, default=1)
    p.add_argument("--scale", type=float, default=0.25)
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--runs", type=Path, help="JSON lines: every row of every run (appended; complete runs are skipped)")
    p.add_argument("--table-only", action="store_true", help="print the table of --runs and stop")
    args = p.parse_args()
    names = [n for n in args.scenarios.split(",") if n]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        p.error(f"unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS)}")
    if args.table_only and not args.runs:
        p.error("--table-only needs --runs FILE")
    runs = [r for r in load_runs(args.runs) if r.get("scale") == args.scale]
    done = {(r["seed"], r["scenario"]) for r in runs}
    started = time.time()
    for seed in [] if args.table_only else range(args.first_seed, args.first_seed + args.seeds):
        for name in names:
            if (seed, name) in done:
                continue
            rows = [{"seed": seed, "scenario": name, "scale": args.scale, **r.to_dict()}
                    for r in run_scenario(name, scale=args.scale, seed=seed, log=lambda line: None)]
            runs += rows
            if args.runs:
                with args.runs.open("a") as f:
                    f.writelines(json.dumps(row, default=str) + "\n" for row in rows)
        print(f"seed {seed} done ({time.time() - started:.0f} s)", file=sys.stderr, flush=True)
    text, failures = table([r for r in runs if r["scenario"] in names])
    print(f"scale {args.scale}; {time.time() - started:.0f} s this time\n{text}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
