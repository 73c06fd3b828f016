"""The isolation defences and the faults that break them: declared once, with their labels.

The engine config (`[defences]`, `[faults]`), the reproduction scenarios (one per fault, each
run with every defence on and then each off alone), the isolation state machine's draws and
the GUI's reconfigure dialog all read these tuples: adding a fault is one Switch here plus
the code that injects it (docs/ARCHITECTURE.md §4).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple


class Staging(NamedTuple):
    """How `main.py reproduce` stages a fault (engine/guard/scenarios.py makes its scenario from
    this); the defaults fit a fault that acts on every request of a steady ordinary workload."""

    scenario: str = ""  # the scenario's name; "" is the fault's name with dashes
    story: str = ""  # what the scenario shows, printed under its table; "" is the fault's help
    with_faults: tuple[str, ...] = ()  # other faults turned on beside it
    workload: str = "steady"  # one of WORKLOADS in engine/guard/scenarios.py
    tenant: str = ""  # the one tenant whose requests the fault acts on (others' alerts are false); "": all
    extra_rows: tuple[str, ...] = ()  # rows after each defence off alone, e.g. "a+b off"


class Switch(NamedTuple):
    name: str  # the config key
    invariant: str  # which invariant it defends (a fault: the one it breaks), docs/INVARIANTS.md I1-I6
    label: str  # what an operator reads
    help: str  # one line: what it does
    staging: Staging = Staging()  # a fault's reproduction scenario (a defence has none)


DEFENCES = (
    Switch("admission", "I2", "Admission (I2): refuse what cannot fit", "refuse what cannot fit, before any allocation"),
    Switch("manifest_check", "I3", "Manifest check (I3): transfers must match their reservation",
           "a transfer must match its reservation"),
    Switch("writer_tag_check", "I1", "Writer-tag check (I1): read and write only own pages",
           "every token slot read or written must be the request's own"),
    Switch("deferred_release", "I4", "Deferred release (I4): hold in-flight pages until their transfer ends",
           "in-flight pages are held until the transfer ends"),
    Switch("scrub", "I5", "Scrub (I5): wipe freed pages", "freed pages are scrubbed per scrub_policy"),
)

FAULTS = (
    Switch("placeholder_on_reject", "I2", "placeholder on reject — the 2026 incident",
           "the incident: a rejected request becomes a 1-token placeholder",
           Staging(scenario="incident-placeholder",
                   story="the 2026 incident: a window of 2,048 tokens over a prefill pool of 1,328 (65%); over-long "
                         "requests are rejected but replaced by a one-token placeholder that still goes through "
                         "prefill and transfer while decode reserved the full length; freed pages are not scrubbed",
                   with_faults=("skip_scrub",), workload="incident", tenant="over-long",
                   extra_rows=("manifest_check+writer_tag_check off",))),
    Switch("skip_scrub", "I5", "skip scrub", "freed pages keep their data"),
    Switch("early_release", "I4", "early release of reserved pages",
           "decode frees reserved pages before their transfer arrives"),
    Switch("short_transfer", "I3", "short transfer (a page fewer than the manifest)",
           "prefill sends one page fewer than its manifest says"),
    Switch("stale_block_table", "I1", "stale block table entry",
           "a decode page table names the page the pool hands out next"),
    Switch("salt_ignored", "I1", "prefix cache ignores the salt (vllm#44701, sglang#37160)",
           "the prefix cache matches on tokens only: a tenant is served another tenant's cached pages",
           Staging(scenario="salt-ignored",
                   story="tenants send the same long system prompt, each salted by its tenant; the prefix cache "
                         "matches on tokens only, so one tenant's requests read pages another tenant's request "
                         "wrote (the timing side channel of InputSnatch and PROMPTPEEK, here with the data)",
                   workload="shared_prefix")),
    Switch("shared_page_written", "I1", "a request writes into a page it shares",
           "decode writes a request's first new token into the last prompt page it shares through the cache",
           Staging(scenario="shared-page-written",
                   story="requests of one tenant share a cached system prompt; each writes its first new token "
                         "into the last shared page instead of a page of its own, and the other holders read it",
                   workload="shared_prefix")),
)

DEFENCE_NAMES = tuple(d.name for d in DEFENCES)
FAULT_NAMES = tuple(f.name for f in FAULTS)


class WeakeningKey(NamedTuple):
    """An engine key that switches an invariant's enforcement off by another name: like a
    defence turned off it needs --allow-faults, and the app's Faults banner names it."""

    name: str  # the [engine] key
    weakens: Callable[[object], bool]  # whether this value of it switches enforcement off
    invariant: str
    label: str  # what an operator reads


WEAKENING_KEYS = (
    WeakeningKey("ownership_policy", lambda v: v != "abort", "I1", "I1 violations reported, not aborted"),
    WeakeningKey("scrub_policy", lambda v: v == "none", "I5", "I5 freed pages not scrubbed"),
)


def weakening_keys(engine: Mapping[str, object]) -> list[tuple[WeakeningKey, object]]:
    """The WEAKENING_KEYS that `engine` (an [engine] section; a key it leaves out is its
    default) sets to a value that switches enforcement off, each with that value."""
    return [(key, engine[key.name]) for key in WEAKENING_KEYS if key.name in engine and key.weakens(engine[key.name])]
