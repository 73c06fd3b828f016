"""Entry point of a worker process: `python -m engine.workers.main --role decode ...`.

Started by the supervisor, never by hand. The worker token comes in the environment
(PAGEWARDEN_WORKER_TOKEN) so that it does not show in `ps`.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import sys

from engine.parent_watch import die_with_parent
from engine.wire.protocol import TOKEN_ENV


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--role", choices=["prefill", "decode"], required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--bus", required=True, help="the supervisor's worker bus endpoint")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--core-slot", type=int, default=0, help="its slot in the run directory's core-share file")
    parser.add_argument("--config-json", required=True, help="the engine config as JSON")
    args = parser.parse_args(argv)
    die_with_parent()  # SIGTERM when the supervisor dies, so no worker outlives it
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    # The supervisor sends SIGUSR1 to a worker that stopped answering before it kills it:
    # the stack lands in the worker's log, and the crash alert quotes it.
    faulthandler.register(signal.SIGUSR1, all_threads=True)

    from engine.config import config_from_dict

    config = config_from_dict(json.loads(args.config_json), source=f"worker {args.name}")
    import torch

    torch.set_num_threads(config.workers.threads_per_worker(len(os.sched_getaffinity(0))))
    if args.role == "prefill":
        from engine.workers.prefill import PrefillWorker as Worker
    else:
        from engine.workers.decode import DecodeWorker as Worker
    worker = Worker(args.name, args.bus, os.environ.get(TOKEN_ENV, ""), config, args.run_dir,
                    core_slot=args.core_slot)
    worker.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
