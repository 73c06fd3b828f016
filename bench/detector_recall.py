"""Detector recall and precision over many seeds: every scenario, every defence row.

    python bench/detector_recall.py [--seeds 30] [--scale 0.25] [--scenarios a,b] [--json FILE]

Each seed runs `reproduce` of each scenario end to end (real server, real worker processes,
canaries on as in every scenario) and sums, per scenario and row: cross-request reads that
happened (ground truth), readers, readers caught, missed, false positives and whether incident
scoping equalled the ground truth in every run. Goal: missed = 0 and false positives = 0 over
every run. Exit status 1 when any run misses, raises a false positive or fails its row.
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=30)
    p.add_argument("--first-seed", type=int, default=1)
    p.add_argument("--scale", type=float, default=0.25)
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--json", type=Path, help="also write every row of every run here")
    args = p.parse_args()
    names = [n for n in args.scenarios.split(",") if n]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        p.error(f"unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS)}")
    totals: dict[tuple[str, str], dict] = defaultdict(lambda: defaultdict(int))
    runs, failures, started = [], [], time.time()
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for name in names:
            for r in run_scenario(name, scale=args.scale, seed=seed, log=lambda line: None):
                t = totals[(name, r.row)]
                t["runs"] += 1
                t["reads"] += r.reads
                t["readers"] += r.readers
                t["caught"] += r.readers - r.missed
                t["missed"] += r.missed
                t["false_positives"] += r.false_positives
                t["scope_differs"] += not r.scope_equal
                t["failed"] += not r.passed
                runs.append({"seed": seed, "scenario": name, **r.to_dict()})
                if not r.passed:
                    failures.append(f"{name} seed {seed} {r.row}: {r.why}")
        print(f"seed {seed} done ({time.time() - started:.0f} s)", file=sys.stderr, flush=True)
    print(f"{args.seeds} seed(s) x {len(names)} scenario(s), scale {args.scale}, {time.time() - started:.0f} s\n")
    print("| scenario | defences | runs | cross reads | readers | caught | missed | false positives "
          "| scope = truth | failed rows |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|---:|")
    for (name, row), t in totals.items():
        print(f"| {name} | {row} | {t['runs']} | {t['reads']:,} | {t['readers']:,} | {t['caught']:,} | "
              f"{t['missed']} | {t['false_positives']} | {'every run' if not t['scope_differs'] else 'NO'} "
              f"| {t['failed']} |")
    for line in failures:
        print(f"- FAIL {line}")
    if args.json:
        args.json.write_text(json.dumps(runs, default=str) + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
