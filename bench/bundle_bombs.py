"""What reading a hostile snapshot bundle costs: peak memory and seconds, each read in a fresh
Python (tests/gui/snapshot/bundle_bombs.py builds the bundles and measures).

    python bench/bundle_bombs.py [--npz-gib 3] [--events-mib 60] [--state-mib 100] [--only npz,events]
                                 [--no-trace]

Bundles: the synthetic snapshot of the bundle tests as written (the baseline); its pages.npz
replaced by one whose single array declares --npz-gib GiB; its events.jsonl replaced by
--events-mib MiB of `{}` lines; its state.json holding --state-mib MiB of `{}` in a list. Each
is read twice: for seconds and the peak RSS increase (VmHWM over the RSS before reading), then
under tracemalloc for the peak of what Python and numpy allocated while reading. Prints a
Markdown table.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gui.snapshot.bundle import write_bundle  # noqa: E402
from tests.gui.snapshot.bundle_bombs import events_bomb, npz_bomb, reading_cost, state_bomb  # noqa: E402
from tests.gui.snapshot.test_snapshot_bundle import make_snapshot  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--npz-gib", type=int, default=3)
    p.add_argument("--events-mib", type=int, default=60)
    p.add_argument("--state-mib", type=int, default=100)
    p.add_argument("--only", default="valid,npz,events,state", help="which bundles, of valid,npz,events,state")
    p.add_argument("--no-trace", dest="trace", action="store_false",
                   help="skip the second read under tracemalloc (slow on a reader without limits)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bundle-bombs-") as tmp:
        tmp = Path(tmp)
        base = write_bundle(make_snapshot(), tmp / "base.zip")
        makers = {
            "valid": ("valid bundle", lambda: base),
            "npz": (f"pages.npz: one array declaring {args.npz_gib} GiB",
                    lambda: npz_bomb(base, tmp / "npz.zip", args.npz_gib)),
            "events": (f"events.jsonl: {args.events_mib} MiB of `{{}}` lines",
                       lambda: events_bomb(base, tmp / "events.zip", args.events_mib)),
            "state": (f"state.json: {args.state_mib} MiB of `{{}}` in a list",
                      lambda: state_bomb(base, tmp / "state.zip", args.state_mib)),
        }
        bundles = {makers[k][0]: makers[k][1]() for k in args.only.split(",") if k}
        print("| bundle | size | peak RSS increase | seconds | traced peak | outcome |\n|---|---:|---:|---:|---:|---|")
        for name, path in bundles.items():
            cost = reading_cost(path)  # seconds and RSS without tracemalloc, which slows the reading
            traced = reading_cost(path, trace=True)["traced_peak_bytes"] if args.trace else None
            outcome = cost["outcome"].replace(str(tmp) + "/", "")
            print(f"| {name} | {path.stat().st_size / 1e6:.2f} MB | {cost['peak_increase_bytes'] / 1e6:,.1f} MB | "
                  f"{cost['seconds']:.2f} | {'-' if traced is None else f'{traced / 1e6:,.1f} MB'} | {outcome} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
