"""Run one pytest target N times in a row while a CPU-heavy process runs beside it.

    python bench/repeat_under_load.py [--runs 20] [--load "CMD"] [--log FILE] [TARGET]

A flaky test is a failing test: this counts passes and failures over back-to-back runs and
prints one line per run (verdict, seconds, 1-minute load average before and after) and a
summary. Without --load the machine's own other work is the load; with it, CMD is started
first (e.g. `python bench/detector_recall.py --seeds 30` or `yes`), kept running (restarted
when it ends before the runs do) and stopped at the end. Exit status 1 when any run fails.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _load() -> float:
    return os.getloadavg()[0]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", nargs="?", default="tests/engine/guard/test_reproduce.py")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--load", help="a command to keep running beside the runs")
    p.add_argument("--log", type=Path, help="append each run's line here too")
    args = p.parse_args()
    if args.runs < 1:
        p.error(f"--runs must be at least 1, got {args.runs}")
    loader = None

    def keep_loading():
        nonlocal loader
        if args.load and (loader is None or loader.poll() is not None):
            loader = subprocess.Popen(shlex.split(args.load), cwd=ROOT, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, start_new_session=True)

    def say(line: str) -> None:
        print(line, flush=True)
        if args.log:
            with args.log.open("a") as f:
                f.write(line + "\n")

    failed, started = [], time.time()
    try:
        for i in range(1, args.runs + 1):
            keep_loading()
            before, t0 = _load(), time.time()
            proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", args.target],
                                  cwd=ROOT, capture_output=True, text=True)
            verdict = "pass" if proc.returncode == 0 else f"FAIL (exit {proc.returncode})"
            say(f"run {i}/{args.runs}: {verdict} in {time.time() - t0:.0f} s, load {before:.1f} -> {_load():.1f}")
            if proc.returncode:
                failed.append(i)
                say("\n".join(proc.stdout.splitlines()[-40:]))
    finally:
        if loader is not None and loader.poll() is None:
            os.killpg(loader.pid, 15)
    say(f"{args.runs - len(failed)} of {args.runs} passed, {len(failed)} failed {failed or ''} "
        f"in {(time.time() - started) / 60:.1f} min; load: {args.load or 'the machine as it was'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
