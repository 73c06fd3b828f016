"""The incident on a real server with an evidence journal: what the journal tests share."""

from __future__ import annotations

import random
import time
from pathlib import Path

from engine.client.local_server import LocalServer, write_config
from engine.guard.scenarios import SCENARIOS, config_sections, defences_for

LEAKING = "manifest_check+writer_tag_check off"  # the incident's row where data really crosses


def incident_config(tmp_path: Path, journal: Path, name: str = "config.toml") -> Path:
    sections = config_sections(SCENARIOS["incident-placeholder"])
    sections["canaries"] = {"enabled": False}
    sections["audit"] = {"journal": str(journal)}
    sections["defences"] = defences_for(LEAKING)
    return write_config(tmp_path / name, **sections)


def start(config: Path, **kw) -> LocalServer:
    server = LocalServer(config, "--allow-faults", **kw)
    server.wait_workers(server.client())
    return server


def submit_wave(client, seed: int, scale: float = 1.0) -> list:
    """The incident workload, submitted at once (not waited for)."""
    work = SCENARIOS["incident-placeholder"].workload(random.Random(seed), scale)
    return [client.submit(stream=False, **{k: v for k, v in w.items() if k != "marker"}) for w in work]


def wait_ends(client, streams, timeout_s: float = 300.0) -> list[dict]:
    ends, deadline = [], time.monotonic() + timeout_s
    for stream in streams:
        while True:
            msg = client.recv_for(stream, max(0.1, deadline - time.monotonic()))
            if msg.op in ("done", "error"):
                ends.append(msg.header)
                break
    return ends


def pair_key(pair: dict) -> tuple:
    return pair["source_slot"], pair["reader_slot"]


def same_scope(live: list[dict], journal: list[dict]) -> list[str]:
    """Differences between two scope answers (empty: the same pairs, reads, pages and times)."""
    out = []
    a, b = {pair_key(p): p for p in live}, {pair_key(p): p for p in journal}
    for key in sorted(set(a) | set(b)):
        if key not in a or key not in b:
            out.append(f"pair {key} only in {'live' if key in a else 'journal'}")
            continue
        for field in ("source", "reader", "reads", "pages", "first", "last"):
            if a[key][field] != b[key][field]:
                out.append(f"pair {key} {field}: live {a[key][field]!r}, journal {b[key][field]!r}")
    return out
