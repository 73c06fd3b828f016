"""How soon the Fleet view shows what happened, in scrape intervals: a real Prometheus (and
Alertmanager) around two real engines, one reproducing the 2026 incident.

    .venv/bin/python bench/fleet_latency.py [--scrape-s 2] [--rounds 3]

Per round: from the faulty engine's first cross read (its own `status`, polled every 50 ms)
to the Fleet view's queries putting it at the top (FleetQuery + fleet_rows, polled every
100 ms); then from `kill -9` of that engine to its row reading down. Printed in seconds and
in scrape intervals (the issue's goal: within two). No assertion: a bench measures.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.adapters.prometheus_fleet import FleetQuery  # noqa: E402
from engine.client.local_server import write_config  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.guard.reproduce import run_workload  # noqa: E402
from engine.guard.scenarios import SCENARIOS, config_sections  # noqa: E402
from gui.model.fleet import fleet_rows  # noqa: E402
from tests import prometheus_stack  # noqa: E402  (the real-stack harness the tests use)

INCIDENT = SCENARIOS["incident-placeholder"]
LEAKING = {"defences": {"manifest_check": False, "writer_tag_check": False}}


def _until(predicate, timeout_s: float, every_s: float) -> float:
    """monotonic time at which predicate() first held; raises TimeoutError."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return time.monotonic()
        time.sleep(every_s)
    raise TimeoutError("did not happen in time")


def one_round(tmp: Path, scrape_s: int, seed: int) -> tuple[float, float]:
    prometheus_stack.SCRAPE_S = scrape_s
    stack = prometheus_stack.Stack(tmp)
    try:
        base = EngineConfig().replace(canaries={"enabled": False})
        healthy = stack.engine("healthy", write_config(tmp / "healthy.toml", base))
        faulty = stack.engine("faulty", write_config(tmp / "faulty.toml", base, **config_sections(INCIDENT)),
                              "--allow-faults")
        clients = {name: server.client(timeout_s=300) for name, server in stack.engines.items()}
        for name, server in stack.engines.items():
            server.wait_workers(clients[name])
        clients["faulty"].reconfigure(LEAKING, apply=True)
        faulty.wait_workers(clients["faulty"])
        stack.start_prometheus()
        query = FleetQuery(stack.prometheus, "pagewarden", timeout_s=30)
        _until(lambda: len(fleet_rows(query.snapshot())) == 2, 120, 0.2)
        watcher = faulty.client(timeout_s=60)
        worker = threading.Thread(target=run_workload, args=(clients["faulty"], INCIDENT.workload(random.Random(seed), 0.5)),
                                  daemon=True)
        worker.start()
        crossed_at = _until(lambda: watcher.call("status", brief=True)["cross_reads"]["total"] > 0, 300, 0.05)

        def faulty_on_top() -> bool:
            rows = fleet_rows(query.snapshot())
            return bool(rows) and rows[0].engine.instance == stack.instance("faulty") and rows[0].urgency == 0

        on_top_at = _until(faulty_on_top, 120, 0.1)
        worker.join(300)
        watcher.close()
        clients["faulty"].close()
        killed_at = time.monotonic()
        faulty.kill()

        def faulty_down() -> bool:
            rows = {r.engine.instance: r for r in fleet_rows(query.snapshot())}
            row = rows.get(stack.instance("faulty"))
            return row is not None and not row.engine.up

        down_at = _until(faulty_down, 120, 0.1)
        del healthy
        return on_top_at - crossed_at, down_at - killed_at
    finally:
        stack.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scrape-s", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="fleet-latency-") as tmp:
            top, down = one_round(Path(tmp), args.scrape_s, seed=7 + r)
        print(f"round {r + 1}: first cross read -> top of the Fleet view {top:.2f} s ({top / args.scrape_s:.2f} "
              f"scrape intervals); kill -> down {down:.2f} s ({down / args.scrape_s:.2f} intervals)", flush=True)


if __name__ == "__main__":
    main()
