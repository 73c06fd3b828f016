"""Named reproduction scenarios: a config (faults, pools) and a workload each.

Sizes keep the incident's proportions where it matters (the prefill pool holds 65% of the
context window) and run on a CPU in well under a minute per scenario.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable

DEFENCES = ("admission", "manifest_check", "writer_tag_check", "deferred_release", "scrub")
PAGE = 16
WINDOW = 2048
PREFILL_PAGES = 83  # 1,328 tokens: 64.8% of the 2,048-token window, as 681,280 / 1,048,576


@dataclass
class Scenario:
    name: str
    story: str
    faults: dict = field(default_factory=dict)
    sections: dict = field(default_factory=dict)
    workload: Callable[[random.Random, float], list[dict]] = None  # (rng, scale) -> submit fields
    rows: tuple[str, ...] = ("all on", *(f"{d} off" for d in DEFENCES))


def _prompt(rng: random.Random, n: int) -> list[int]:
    return [256] + [rng.randrange(32, 127) for _ in range(n - 1)]


def ordinary(rng: random.Random, count: int, *, longest: int = 600) -> list[dict]:
    return [{"prompt_ids": _prompt(rng, rng.randrange(20, longest)), "max_new_tokens": rng.randrange(4, 24),
             "ignore_eos": True, "tenant": rng.choice(("acme", "globex", "initech"))} for _ in range(count)]


def incident_workload(rng: random.Random, scale: float) -> list[dict]:
    """Fill the decode pool with ordinary prompts, then over-long ones among more ordinary ones:
    the over-long prompts exceed the prefill pool but not the window."""
    n = max(4, int(24 * scale))
    work = ordinary(rng, n, longest=900)
    for _ in range(max(2, int(6 * scale))):
        work += ordinary(rng, 2, longest=600)
        work.append({"prompt_ids": _prompt(rng, rng.randrange(1400, 1900)), "max_new_tokens": 8,
                     "ignore_eos": True, "tenant": "over-long"})
    return work


def steady(rng: random.Random, scale: float) -> list[dict]:
    return ordinary(rng, max(6, int(40 * scale)))


def thousands(rng: random.Random, scale: float) -> list[dict]:
    return ordinary(rng, max(20, int(2000 * scale)), longest=200)


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("incident-placeholder",
             "the 2026 incident: a window of 2,048 tokens over a prefill pool of 1,328 (65%); over-long "
             "requests are rejected but replaced by a one-token placeholder that still goes through prefill "
             "and transfer while decode reserved the full length; freed pages are not scrubbed",
             faults={"placeholder_on_reject": True, "skip_scrub": True}, workload=incident_workload,
             rows=("all on", *(f"{d} off" for d in DEFENCES), "manifest_check+writer_tag_check off")),
    Scenario("skip-scrub", "freed pages keep their data", faults={"skip_scrub": True}, workload=steady),
    Scenario("early-release", "decode frees reserved pages before their transfer arrives",
             faults={"early_release": True}, workload=steady),
    Scenario("short-transfer", "prefill sends one page fewer than its manifest says",
             faults={"short_transfer": True}, workload=steady),
    Scenario("stale-block-table", "a decode page table names the page the pool hands out next",
             faults={"stale_block_table": True}, workload=steady),
    Scenario("clean", "thousands of ordinary requests with canaries due ten a second (at most two running at once), no fault", workload=thousands,
             sections={"canaries": {"enabled": True, "per_minute": 600}}, rows=("all on",)),
)}


def config_sections(scenario: Scenario) -> dict:
    """The scenario's engine config sections (beside the defaults)."""
    sections = {
        "engine": {"context_window": WINDOW, "page_size": PAGE, "max_batch": 16},
        "pools": {"prefill": {"pages": PREFILL_PAGES}, "decode": {"pages": 512}},
        "canaries": {"enabled": True, "per_minute": 60},
        "faults": dict(scenario.faults),
    }
    for name, values in scenario.sections.items():
        sections[name] = {**sections.get(name, {}), **values}
    return sections


def defences_for(row: str) -> dict:
    """"all on", "X off" or "X+Y off" -> the [defences] section for that row."""
    off = set(row.removesuffix(" off").split("+")) if row.endswith(" off") else set()
    unknown = off - set(DEFENCES)
    if unknown:
        raise ValueError(f"row {row!r} names unknown defences {sorted(unknown)}; known: {', '.join(DEFENCES)}")
    return {d: d not in off for d in DEFENCES}
