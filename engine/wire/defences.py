"""The isolation defences and the faults that break them: declared once, with their labels.

The engine config (`[defences]`, `[faults]`), the reproduction scenarios (one row per
defence turned off) and the GUI's reconfigure dialog all read these tuples; adding a fault
is one line here plus the code that injects it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple


class Switch(NamedTuple):
    name: str  # the config key
    invariant: str  # which invariant it defends (a fault: the one it breaks), docs/INVARIANTS.md I1-I6
    label: str  # what an operator reads
    help: str  # one line: what it does


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
           "the incident: a rejected request becomes a 1-token placeholder"),
    Switch("skip_scrub", "I5", "skip scrub", "freed pages keep their data"),
    Switch("early_release", "I4", "early release of reserved pages",
           "decode frees reserved pages before their transfer arrives"),
    Switch("short_transfer", "I3", "short transfer (a page fewer than the manifest)",
           "prefill sends fewer pages than its manifest says"),
    Switch("stale_block_table", "I1", "stale block table entry",
           "a page-table entry keeps a page freed by another request"),
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
