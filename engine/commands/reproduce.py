"""`reproduce SCENARIO`: a named incident scenario end to end on real worker processes."""

from __future__ import annotations

import json
import sys

from engine.commands.common import EXIT_FINDING, EXIT_OK, EXIT_USAGE


def register(sub) -> None:
    from engine.guard.scenarios import SCENARIOS

    rep = sub.add_parser(
        "reproduce", help="run an isolation scenario end to end and tabulate what each detector caught",
        description="Start an engine with the scenario's faults (--allow-faults), run it with every defence "
        "on and then with each defence off alone, and print: requests, cross-request reads that "
        "really happened (ground truth), which detectors caught them, misses, prevented requests, "
        "false positives, and whether incident scoping equals the ground truth. Exit 0 only when "
        "every row holds. Scenarios: " + ", ".join(SCENARIOS) + ", or all.",
    )
    rep.add_argument("scenario", help="scenario name, or all")
    rep.add_argument("--scale", type=float, default=1.0, help="workload size factor (default 1)")
    rep.add_argument("--seed", type=int, help="workload seed (default: random, printed)")
    rep.add_argument("--json", action="store_true", help="end with one JSON line of every row")
    rep.set_defaults(func=cmd_reproduce)


def cmd_reproduce(args) -> int:
    import random

    from engine.guard.reproduce import format_table, run_scenario
    from engine.guard.scenarios import SCENARIOS

    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(f"error: unknown scenario {unknown[0]!r}; known: {', '.join(SCENARIOS)}, all", file=sys.stderr)
        return EXIT_USAGE
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    log = (lambda line: print(line, file=sys.stderr)) if args.json else print
    log(f"reproduce {' '.join(names)} (seed {seed}, scale {args.scale})")
    everything, ok = {}, True
    for name in names:
        results = run_scenario(name, scale=args.scale, seed=seed, log=log)
        everything[name] = [r.to_dict() for r in results]
        ok &= all(r.passed for r in results)
        if not args.json:
            print()
            print(format_table(name, results))
            print(f"\n{SCENARIOS[name].story}\n")
    if args.json:
        print(json.dumps({"seed": seed, "passed": ok, "scenarios": everything}))
    return EXIT_OK if ok else EXIT_FINDING
