"""The isolation defences and the faults that break them: declared once, with their labels.

The engine config (`[defences]`, `[faults]`), the reproduction scenarios (one row per
defence turned off) and the GUI's reconfigure dialog all read these tuples; adding a fault
is one line here plus the code that injects it.
"""

from __future__ import annotations

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
