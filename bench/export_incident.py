"""Snapshot export at incident scale (issue 15, item 1): the incident workload on a real
engine until it has made N cross-request reads, then the export, timed step by step.

    python bench/export_incident.py [--reads 1000000] [--scale 1.0] [--keep DIR]

The engine runs the 2026 incident (`placeholder_on_reject`, `skip_scrub`, manifest and
writer-tag checks off, window 2,048 over an 83-page prefill pool), canaries off. Waves of
the scenario's workload run until the engine's read log counts N reads. Then an incident
snapshot of everything the engine keeps is exported twice: the steps of `collect()` and
`write_bundle()` in process (seconds each, bytes of state.json, this process's peak memory
growth), and `main.py snapshot` as an operator runs it (wall seconds). The supervisor's
resident memory is printed before and after the waves. Goal: under 30 s for >= 1,000,000
cross reads, with bounded memory.
"""

from __future__ import annotations

import argparse
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.client.local_server import LocalServer, write_config  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.guard.reproduce import run_workload  # noqa: E402
from engine.guard.scenarios import SCENARIOS, config_sections  # noqa: E402


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reads", type=int, default=1_000_000, help="cross reads to make before exporting")
    p.add_argument("--scale", type=float, default=1.0, help="workload scale of one wave")
    p.add_argument("--max-waves", type=int, default=200)
    p.add_argument("--keep", type=Path, help="keep the engine's run dir and the bundles here")
    args = p.parse_args()
    from engine.client import EngineClient
    from gui.snapshot.bundle import read_bundle, write_bundle
    from gui.snapshot.collect import collect

    work_dir = args.keep or Path(tempfile.mkdtemp(prefix="pw-export-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    scenario = SCENARIOS["incident-placeholder"]
    sections = config_sections(scenario)
    sections["defences"] = {"manifest_check": False, "writer_tag_check": False}
    config = write_config(work_dir / "incident.toml", EngineConfig().replace(canaries={"enabled": False}),
                          **sections)
    server = LocalServer(config, "--allow-faults")
    try:
        client = EngineClient(server.control, timeout_s=600)
        server.wait_workers(client)
        sup_pid = server.proc.pid
        print(f"engine up; supervisor RSS {rss_mib(sup_pid):.0f} MiB", flush=True)
        rng, t0, waves = random.Random(1), time.time(), 0
        while True:
            crossings = client.status()["crossings"]
            if crossings["reads"] >= args.reads or waves >= args.max_waves:
                break
            run_workload(client, scenario.workload(rng, args.scale))
            waves += 1
            print(f"wave {waves}: {client.status()['crossings']['reads']:,} cross reads, "
                  f"{time.time() - t0:.0f} s", flush=True)
        print(f"{crossings['reads']:,} cross reads, {crossings['pairs']:,} pairs after {waves} waves in "
              f"{time.time() - t0:.0f} s; supervisor RSS {rss_mib(sup_pid):.0f} MiB", flush=True)

        steps: dict[str, float] = {}

        class Timed:  # the client, each call timed by op
            def __getattr__(self, name):
                method = getattr(client, name)

                def timed(*a, **kw):
                    s = time.perf_counter()
                    try:
                        return method(*a, **kw)
                    finally:
                        key = a[0] if name == "call" else name
                        steps[key] = steps.get(key, 0.0) + time.perf_counter() - s
                return timed

        base = peak_mib()
        s = time.perf_counter()
        snap = collect(Timed(), endpoint=server.control)
        steps["collect"] = time.perf_counter() - s
        s = time.perf_counter()
        path = write_bundle(snap, work_dir / "in-process.zip")
        steps["write_bundle"] = time.perf_counter() - s
        s = time.perf_counter()
        opened = read_bundle(path)
        steps["read_bundle (check)"] = time.perf_counter() - s
        state_bytes = len((work_dir / "in-process.zip").read_bytes())
        print(f"in process: {' · '.join(f'{k} {v:.2f} s' for k, v in steps.items())}")
        print(f"  {len(opened.state['requests']):,} requests, {len(opened.state['scope']['pairs']):,} pairs, "
              f"{opened.state['scope']['reads']:,} reads scoped, bundle {state_bytes / 1e6:.1f} MB, "
              f"warnings {opened.warnings or 'none'}; exporter peak RSS +{peak_mib() - base:.0f} MiB")
        s = time.perf_counter()
        proc = subprocess.run([sys.executable, "main.py", "snapshot", "--engine", server.control,
                               "--out", str(work_dir / "cli.zip")], cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - s
        print(f"main.py snapshot: exit {proc.returncode} in {wall:.1f} s: "
              f"{(proc.stdout or proc.stderr).strip().splitlines()[-1:]}")
        print(f"supervisor RSS after export {rss_mib(sup_pid):.0f} MiB")
        client.close()
        return 0 if proc.returncode == 0 and wall < 30 else 1
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
