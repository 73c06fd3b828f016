"""What the evidence journal costs: throughput with it on against off, measured side by side in
one run, on two workloads; and its size after the three-wave incident.

    .venv/bin/python bench/journal_cost.py [--rounds 3] [--waves 3] [--skip-served]

1. The served workload of `bench/vs_vllm.py --quick` (ours only: the copy checkpoint, 64-id
   prompts, 32 new tokens, concurrency 1 and 16, streamed and not): whole server runs with
   `[audit] journal` on and off alternate --rounds times; tokens/s pooled per case, on / off.
2. The incident (scenario incident-placeholder, the leaking row: manifest_check and
   writer_tag_check off), --waves waves one after the other on one server, journal on against
   off, alternating whole runs --rounds times: requests/s over the waves, and with the journal on
   its bytes on disk, records written and dropped.
Goal (issue): on / off >= 0.98 on both. A ratio below 1 within the spread of the rounds is noise.

Wall-clock throughput on a shared 2-core machine swings by tens of percent between server runs,
so the incident part also counts CPU time (from /proc, which other processes' load barely
moves): the supervisor's and all the engine's processes' seconds per request. The journal's
cost is what it adds to the supervisor, as a share of all the engine's CPU: on a saturated
machine that is the throughput it can take.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def served(rounds: int, work: Path) -> dict:
    """vs_vllm's --quick workload against our HTTP server, journal on and off; tokens/s per case,
    and CPU seconds per generated token of the supervisor and of every engine process."""
    import vs_vllm

    from engine.client.local_server import LocalServer, write_config

    args = vs_vllm.parse_args(["--quick", "--only", "ours", "--model", "copy"])
    model_dir, (low, high) = vs_vllm.checkpoint("copy")
    prompts = vs_vllm.make_prompts(max(args.concurrency), args.prompt, low, high,
                                   exclude=vs_vllm.special_ids(model_dir), seed=args.seed)
    top = max(args.concurrency)
    pages = vs_vllm.our_pages(top, args.prompt, args.new_tokens)
    out: dict = {"on": {}, "off": {}, "cpu": {"on": [], "off": []}}
    for r in range(rounds):
        for mode in (("on", "off") if r % 2 == 0 else ("off", "on")):
            journal = str(work / f"served-{r}.sqlite") if mode == "on" else ""
            print(f"served, round {r + 1}/{rounds}, journal {mode}", flush=True)
            config = write_config(work / f"served-{r}-{mode}.toml", model={"path": str(model_dir)},
                                  engine={"max_batch": 64, "max_prefill_tokens": 4096}, canaries={"enabled": False},
                                  pools={"prefill": {"pages": pages}, "decode": {"pages": pages}},
                                  audit={"journal": journal})
            server = LocalServer(config, "--http-port", "0")
            try:
                client = server.client(timeout_s=300)
                server.wait_workers(client)
                pids = [server.proc.pid] + [w["pid"] for w in client.status()["workers"]]
                cpu0, tokens0 = [cpu_seconds(p) for p in pids], client.status()["metrics"]["tokens_total"]
                got = asyncio.run(vs_vllm.measure(server.ready["http"], prompts, args))
                tokens = client.status()["metrics"]["tokens_total"] - tokens0
                used = [cpu_seconds(p) - c for p, c in zip(pids, cpu0)]
                out["cpu"][mode].append((used[0] / tokens, sum(used) / tokens))
            finally:
                server.stop()
            for case, batches in got["cases"].items():
                out[mode].setdefault(case, []).extend(b["tok_s"] for b in batches)
    return out


def cpu_seconds(pid: int) -> float:
    """user + system CPU seconds of a process, its threads included (from /proc)."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def incident(rounds: int, waves: int, work: Path) -> dict:
    from tests.engine.evidence.incident_run import incident_config, start, submit_wave, wait_ends

    out: dict = {"on": [], "off": [], "bytes": [], "written": [], "dropped": [], "cpu": {"on": [], "off": []}}
    for r in range(rounds):
        for mode in (("on", "off") if r % 2 == 0 else ("off", "on")):
            journal = work / f"incident-{r}-{mode}.sqlite"
            config = incident_config(work, journal, name=f"incident-{r}-{mode}.toml")
            if mode == "off":
                text = config.read_text().replace(f'journal = "{journal}"', 'journal = ""')
                config.write_text(text)
            server = start(config)
            try:
                client = server.client(timeout_s=600)
                pids = [server.proc.pid] + [w["pid"] for w in client.status()["workers"]]
                cpu0 = [cpu_seconds(pid) for pid in pids]
                requests, t0 = 0, time.perf_counter()
                for wave in range(waves):
                    ends = wait_ends(client, submit_wave(client, seed=100 + wave), timeout_s=600)
                    requests += len(ends)
                rate = requests / (time.perf_counter() - t0)
                out[mode].append(rate)
                used = [cpu_seconds(pid) - c for pid, c in zip(pids, cpu0)]
                out["cpu"][mode].append((used[0] / requests, sum(used) / requests))
                status = client.status()
                if mode == "on":
                    assert client.status()["evidence"]["journal"], "the journal was not on"
                    deadline = time.monotonic() + 30
                    while client.status()["evidence"]["queued"] and time.monotonic() < deadline:
                        time.sleep(0.2)
                    evidence = client.status()["evidence"]
                    out["bytes"].append(evidence["bytes"])
                    out["written"].append(evidence["written"])
                    out["dropped"].append(evidence["dropped"])
                else:
                    assert status["evidence"]["journal"] is None, "the journal was not off"
                print(f"incident, round {r + 1}/{rounds}, journal {mode}: {requests} requests, {rate:.2f} req/s, "
                      f"{status['cross_reads']['total']:,} cross reads", flush=True)
            finally:
                server.stop()
    return out


def cpu_share(cpu: dict, per: str, unit: str, scale: float) -> str:
    """The journal's CPU cost from {mode: [(supervisor, all processes) seconds per `per`]}: what
    it adds to the supervisor (medians), as a share of all the engine's CPU without it."""
    sup_on = statistics.median(c[0] for c in cpu["on"])
    sup_off = statistics.median(c[0] for c in cpu["off"])
    total = statistics.median(c[1] for c in cpu["off"])

    def runs(mode):
        return [tuple(round(scale * x, 2) for x in c) for c in cpu[mode]]

    return (f"CPU {unit} per {per}: supervisor {scale * sup_on:.2f} with the journal, {scale * sup_off:.2f} "
            f"without; all engine processes {scale * total:.1f} without. The journal adds "
            f"{scale * (sup_on - sup_off):.2f} {unit}, {100 * (sup_on - sup_off) / total:.2f}% of the engine's "
            f"CPU (on {runs('on')}, off {runs('off')})")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3, help="alternating on/off server runs per workload")
    p.add_argument("--waves", type=int, default=3, help="incident waves per server run")
    p.add_argument("--skip-served", action="store_true")
    p.add_argument("--skip-incident", action="store_true")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="pw-journal-cost-"))
    if not args.skip_served:
        got = served(args.rounds, work)
        print("\n== served (vs_vllm --quick workload, ours): tokens/s median (all reps of all rounds) ==")
        print(f"{'case':<16} {'journal on':>12} {'journal off':>12} {'on / off':>9}")
        for case in got["on"]:
            on, off = statistics.median(got["on"][case]), statistics.median(got["off"][case])
            print(f"{case:<16} {on:>12.1f} {off:>12.1f} {on / off:>9.3f}   (on {sorted(round(x) for x in got['on'][case])}"
                  f", off {sorted(round(x) for x in got['off'][case])})")
        print(cpu_share(got["cpu"], "generated token", "us", 1e6))
    if not args.skip_incident:
        got = incident(args.rounds, args.waves, work)
        on, off = statistics.median(got["on"]), statistics.median(got["off"])
        print(f"\n== incident ({args.waves} waves per run, {args.rounds} runs each): requests/s median ==")
        print(f"journal on {on:.3f}, off {off:.3f}, on / off {on / off:.3f}   (on {[round(x, 3) for x in got['on']]}, "
              f"off {[round(x, 3) for x in got['off']]})")
        print(f"journal after {args.waves} waves: {[b for b in got['bytes']]} bytes, {got['written']} records "
              f"written, {got['dropped']} dropped")
        print(cpu_share(got["cpu"], "request", "ms", 1e3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
