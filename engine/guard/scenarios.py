"""Named reproduction scenarios: a config (faults, pools) and a workload each.

One scenario per fault of engine/wire/defences.py, made from its declaration (`Staging`), and
`clean`, which has none. Sizes keep the incident's proportions where it matters (the prefill
pool holds 65% of the context window) and run on a CPU in well under a minute per scenario.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable

from engine.wire.defences import DEFENCE_NAMES as DEFENCES
from engine.wire.defences import FAULT_NAMES, FAULTS, Switch
from engine.wire.prompt_form import PROMPT_FORM

PAGE = 16
WINDOW = 2048
PREFILL_PAGES = 83  # 1,328 tokens: 64.8% of the 2,048-token window, as 681,280 / 1,048,576
ROWS = ("all on", *(f"{d} off" for d in DEFENCES))  # a scenario's rows unless it says otherwise


@dataclass
class Scenario:
    name: str
    story: str
    faults: dict = field(default_factory=dict)
    sections: dict = field(default_factory=dict)
    workload: Callable[[random.Random, float], list[dict]] = None  # (rng, scale) -> submit fields
    rows: tuple[str, ...] = ROWS
    tenant: str = ""  # the one tenant whose requests the faults act on; "": every request


BOS = 256  # the byte-level default model's <s>
ALNUM = "abcdefghijklmnopqrstuvwxyz0123456789"
FORM_IDS = len(PROMPT_FORM.format(text="").encode())  # the instruction after the text


def marker(rng: random.Random) -> str:
    """A 24-40 character random marker: the request's own secret, found in no other prompt."""
    return "".join(rng.choice(ALNUM) for _ in range(rng.randrange(24, 41)))


def copy_prompt(rng: random.Random, n: int, *, repeat: bool = False) -> tuple[list[int], str]:
    """n tokens: <s>, a text that starts with a fresh marker, the instruction to repeat it.
    The default model answers with the text, marker first; the marker in any other request's
    output is data that crossed between requests. The rest of the text is random words, or
    with `repeat` the marker again and again: a document full of its owner's secret, so that
    any page of it read by another request carries attributable text."""
    secret = marker(rng)
    size = max(1, n - 1 - FORM_IDS)
    words = [secret]
    while sum(len(w) + 1 for w in words) < size:
        words.append(secret if repeat else "".join(rng.choice(ALNUM) for _ in range(rng.randrange(3, 12))))
    text = " ".join(words)[:size]
    return [BOS, *PROMPT_FORM.format(text=text).encode()], secret[:size]


def ordinary(rng: random.Random, count: int, *, longest: int = 600) -> list[dict]:
    work = []
    for _ in range(count):
        ids, secret = copy_prompt(rng, rng.randrange(80, longest), repeat=True)
        work.append({"prompt_ids": ids, "marker": secret, "max_new_tokens": rng.randrange(4, 24),
                     "ignore_eos": True, "tenant": rng.choice(("acme", "globex", "initech"))})
    return work


def incident_workload(rng: random.Random, scale: float) -> list[dict]:
    """Fill the decode pool with ordinary prompts, then over-long ones among more ordinary ones:
    the over-long prompts exceed the prefill pool but not the window."""
    n = max(4, int(24 * scale))
    work = ordinary(rng, n, longest=900)
    for _ in range(max(2, int(6 * scale))):
        work += ordinary(rng, 2, longest=600)
        ids, secret = copy_prompt(rng, rng.randrange(1400, 1900), repeat=True)
        work.append({"prompt_ids": ids, "marker": secret, "max_new_tokens": 96, "ignore_eos": True,
                     "tenant": "over-long"})
    return work


def steady(rng: random.Random, scale: float) -> list[dict]:
    return ordinary(rng, max(6, int(40 * scale)))


def thousands(rng: random.Random, scale: float) -> list[dict]:
    return ordinary(rng, max(20, int(2000 * scale)), longest=200)


def shared_prefix(rng: random.Random, scale: float) -> list[dict]:
    """Three tenants send requests that open with the same long system text (about 12 pages),
    then a marker of their own: under [prefix_cache] scope = "tenant" each tenant shares the
    system pages among its own requests only. Sent in two waves, so that the second finds
    what the first cached."""
    system = " ".join("".join(rng.choice(ALNUM) for _ in range(rng.randrange(3, 12))) for _ in range(40))[:190]
    work = []
    for _ in range(max(6, int(24 * scale))):
        secret = marker(rng)
        text = f"{system} {secret} " + " ".join(secret for _ in range(3))
        work.append({"prompt_ids": [BOS, *PROMPT_FORM.format(text=text).encode()], "marker": secret,
                     "max_new_tokens": rng.randrange(4, 24), "ignore_eos": True,
                     "tenant": rng.choice(("acme", "globex", "initech")), "wave": len(work) % 2})
    return sorted(work, key=lambda w: w["wave"])


WORKLOADS = {"steady": steady, "incident": incident_workload, "thousands": thousands,
             "shared_prefix": shared_prefix}  # Staging.workload


def fault_scenario(fault: Switch) -> Scenario:
    """The scenario that stages `fault`, from its declaration; raises ValueError naming a
    workload or a fault its Staging names that does not exist."""
    staging = fault.staging
    if staging.workload not in WORKLOADS:
        raise ValueError(f"fault {fault.name}: unknown workload {staging.workload!r}; known: {', '.join(WORKLOADS)}")
    unknown = [name for name in staging.with_faults if name not in FAULT_NAMES]
    if unknown:
        raise ValueError(f"fault {fault.name}: with_faults names unknown faults {unknown}")
    # a prefix cache keeps finished prompts' pages cached instead of handing them, stale, to the
    # next reservation: the faults that need stale pages are staged as they happened, without one
    scope = "tenant" if staging.workload == "shared_prefix" else "off"
    return Scenario(staging.scenario or fault.name.replace("_", "-"), staging.story or fault.help,
                    faults=dict.fromkeys((fault.name, *staging.with_faults), True),
                    sections={"prefix_cache": {"scope": scope}},
                    workload=WORKLOADS[staging.workload], tenant=staging.tenant,
                    rows=(*ROWS, *staging.extra_rows))


CLEAN = Scenario("clean", "thousands of ordinary requests with canaries due ten a second (at most two running at "
                 "once), no fault", workload=thousands, sections={"canaries": {"enabled": True, "per_minute": 600}},
                 rows=("all on",))
SCENARIOS: dict[str, Scenario] = {s.name: s for s in (*map(fault_scenario, FAULTS), CLEAN)}


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
