"""ProbeSchedule: the leak probe (or, asked, the cache_salt check) run from the window
against an OpenAI-compatible endpoint, every N minutes until stopped, and the local alerts
its results become.

Qt-free: the window's timer asks `due(now)`, a worker thread runs the rounds, and the
window hands each round (or error, or salt-check report) back here; this file builds the
AlertRow records (`canary_marker_in_output` per finding, SALT_SHARED_KIND when salts share
the cache, `probe_error` per failure or undecided salt check) and the status text.
The clock is the caller's (time.monotonic in the window, a number in the tests).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from engine.adapters.salt_check import DEFAULT_PAIRS, HOLDS, PAIRS, SHARED
from engine.wire.alert_kinds import BY_NAME, alert_kind
from engine.wire.states import AlertState
from gui.model.engine_state import AlertRow

MAX_ROUNDS = 50  # as `main.py probe`
MAX_EVERY_MINUTES = 24 * 60
DEFAULT_URL = "http://127.0.0.1:8000"
ALERT_PREFIX = "probe:"  # ids of local alerts: the engine never sees them
# Salts sharing the cache: its own kind once declared in engine/wire/alert_kinds.py (proposed,
# not yet there); until then the black-box probe's critical finding kind.
SALT_SHARED_KIND = "cache_salt_shared" if "cache_salt_shared" in BY_NAME else "canary_marker_in_output"


@dataclass(frozen=True)
class ProbeRequest:
    url: str
    model: str | None = None
    rounds: int = 3
    every_minutes: float = 0.0  # 0: once
    allow_remote: bool = False
    salt_check: bool = False  # the cache_salt check instead of leak rounds
    pairs: int = DEFAULT_PAIRS  # of each kind, for the salt check


def check_probe_request(url: str, model: str = "", rounds: int = 3, every_minutes: float = 0.0,
                        allow_remote: bool = False, *, is_loopback=None, salt_check: bool = False,
                        pairs: int = DEFAULT_PAIRS) -> ProbeRequest:
    """What the dialog holds -> ProbeRequest. Raises ValueError naming the field and value.
    `is_loopback(host)` decides which hosts need `allow_remote` (engine.wire.sockets.is_loopback_host)."""
    url = url.strip()
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"URL {url!r} must be http://HOST[:PORT] or https://HOST[:PORT]")
    try:
        parts.port
    except ValueError:
        raise ValueError(f"URL {url!r} has a port outside 0..65535") from None
    if is_loopback is not None and not is_loopback(parts.hostname) and not allow_remote:
        raise ValueError(f"URL host {parts.hostname} is not loopback; tick 'Allow a remote host' to probe it")
    if not salt_check and not 1 <= rounds <= MAX_ROUNDS:
        raise ValueError(f"Rounds {rounds} is outside 1..{MAX_ROUNDS}")
    if salt_check and not PAIRS[0] <= pairs <= PAIRS[1]:
        raise ValueError(f"Pairs {pairs} is outside {PAIRS[0]}..{PAIRS[1]}")
    if not 0 <= every_minutes <= MAX_EVERY_MINUTES:
        raise ValueError(f"Every {every_minutes:g} minutes is outside 0..{MAX_EVERY_MINUTES} (0: once)")
    return ProbeRequest(url, model.strip() or None, rounds, float(every_minutes), allow_remote, salt_check, pairs)


@dataclass
class ProbeSchedule:
    """One scheduled probe: runs start when due, one at a time, until stop()."""

    request: ProbeRequest
    started_at: float  # the caller's clock
    next_at: float | None = None  # None: no further run (once, or stopped)
    running: bool = False
    stopped: bool = False
    runs: int = 0
    rounds: int = 0
    findings: int = 0
    errors: int = 0
    last_error: str = ""
    salt_verdict: str = ""  # the last salt check's
    alerts: list[AlertRow] = field(default_factory=list)

    def __post_init__(self):
        self.next_at = self.started_at

    @property
    def active(self) -> bool:
        """Running now or due later."""
        return self.running or self.next_at is not None

    def due(self, now: float) -> bool:
        return not self.running and self.next_at is not None and now >= self.next_at

    def start_run(self, now: float) -> None:
        """A run begins; the next is due `every_minutes` after this start (once a run is over)."""
        self.running = True
        self.runs += 1
        every = self.request.every_minutes
        self.next_at = now + 60.0 * every if every > 0 else None

    def end_run(self) -> None:
        self.running = False

    def stop(self) -> None:
        """No further run; a run in progress still reports its rounds."""
        self.next_at = None
        self.stopped = True

    # ---- results -> alerts --------------------------------------------------------------
    def add_round(self, report, markers: dict[int, str], when: float | None = None) -> list[AlertRow]:
        """A RoundReport (round, findings with round/reply/fragment/marker_round) -> one
        critical alert per finding. `markers`: round -> the marker that round sent."""
        when = time.time() if when is None else when
        self.rounds += 1
        new = []
        for n, finding in enumerate(report.findings, start=1):
            marker = markers.get(finding.marker_round, "?")
            detail = (f"{self.request.url}: round {finding.round}, follow-up {finding.reply} carried "
                      f"'{finding.fragment}' ({len(finding.fragment)} characters of round {finding.marker_round}'s "
                      f"marker '{marker}')\nrun {self.runs}; model {self.request.model or 'first listed'}; "
                      "another request's data came back in this reply (black-box probe)")
            new.append(self._alert(f"r{self.runs}-{finding.round}-{finding.reply}-{n}", "canary_marker_in_output",
                                   "critical", detail, when))
        if report.marker_error:
            new.append(self._alert(f"r{self.runs}-{report.round}-marker", "probe_error", "warning",
                                   f"{self.request.url}: round {report.round}: marker prompt refused: "
                                   f"{report.marker_error}", when))
        self.findings += len(report.findings)
        return new

    def add_salt_report(self, report, when: float | None = None) -> list[AlertRow]:
        """A SaltReport -> a critical alert when salts share the cache, a warning when the
        check could not say that isolation holds (no cache seen, inconclusive), none when it holds."""
        when = time.time() if when is None else when
        self.salt_verdict = report.verdict
        if report.verdict == HOLDS:
            return []
        detail = "\n".join(report.lines()) + f"\nrun {self.runs} (black-box cache_salt check)"
        if report.verdict == SHARED:
            self.findings += 1
            return [self._alert(f"r{self.runs}-salt", SALT_SHARED_KIND, "critical", detail, when)]
        return [self._alert(f"r{self.runs}-salt", "probe_error", "warning", detail, when)]

    def add_error(self, message: str, when: float | None = None) -> AlertRow:
        """The run could not probe (unreachable, refused, not the API) -> a warning alert."""
        when = time.time() if when is None else when
        self.errors += 1
        self.last_error = message
        return self._alert(f"r{self.runs}-error", "probe_error", "warning", f"{self.request.url}: {message}", when)

    def _alert(self, key: str, kind: str, severity: str, detail: str, when: float) -> AlertRow:
        alert_kind(kind)  # declared in engine/wire/alert_kinds.py, as the engine's are
        row = AlertRow(f"{ALERT_PREFIX}{int(self.started_at * 1000)}:{key}", kind, severity, AlertState.FIRING, False,
                       when, when, 1, [], [], detail)
        self.alerts.append(row)
        return row

    def status_text(self, now: float) -> str:
        """"probe: 3 rounds, 1 finding · next in 4 min" (or "salt check: salt isolation holds
        · done") — for the status bar."""
        if self.request.salt_check:
            text = f"salt check: {self.salt_verdict or 'no verdict yet'}"
        else:
            text = (f"probe: {self.rounds} round{'s' * (self.rounds != 1)}, "
                    f"{self.findings} finding{'s' * (self.findings != 1)}")
        if self.errors:
            text += f", {self.errors} error{'s' * (self.errors != 1)}"
        if self.running:
            return text + " · running"
        if self.next_at is not None:
            wait = max(0.0, self.next_at - now)
            return text + (f" · next in {wait / 60:.0f} min" if wait >= 60 else f" · next in {wait:.0f} s")
        return text + (" · stopped" if self.stopped else " · done")
