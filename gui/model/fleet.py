"""The Fleet view's rows (Qt-free): every engine a Prometheus knows, worst first.

`fleet_rows(snapshot)` is a pure function from a FleetSnapshot to `FleetRow`s sorted by
urgency (URGENCY: data crossed, then isolation alerts firing, down, window over a pool,
restarting, the rest; ties by name), each with the one-line finding an operator reads first.
`FleetModel` keeps the last good rows when a refresh fails, and says how old they are.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from engine.adapters.prometheus_fleet import EngineRow, FleetSnapshot

# rank -> what puts an engine there (lower is more urgent)
URGENCY = ("data crossed", "isolation alert firing", "down", "window over pool", "restarting", "")
COLUMNS = ("Engine", "Finding", "Up", "Kind", "Model", "Pool usage", "Last 10 min", "Critical",
           "Cross reads 5m", "Restarts 15m / all", "Age", "Defences off", "Faults on", "Control")


@dataclass(frozen=True)
class FleetRow:
    engine: EngineRow
    urgency: int  # index into URGENCY
    finding: str

    @property
    def id(self) -> str:  # RowTableModel's key
        return self.engine.instance

    @property
    def attachable(self) -> bool:
        return bool(self.engine.control)


def urgency_of(e: EngineRow) -> int:
    if e.crossed_events_5m > 0 or e.cross_reads_5m > 0:
        return 0
    if e.critical_firing > 0:
        return 1
    if e.up is False:
        return 2
    if e.capacity_exceeds:
        return 3
    if e.restarts_15m > 0:
        return 4
    return 5


def finding_of(e: EngineRow) -> str:
    """The row's finding: what is wrong, most urgent first, or "healthy"."""
    words = []
    if e.crossed_events_5m > 0 or e.cross_reads_5m > 0:
        words.append(f"data crossed: {count_words(e.crossed_events_5m)} events, {count_words(e.cross_reads_5m)} "
                     f"reads (5 min)")
    if e.critical_firing:
        words.append(f"{e.critical_firing} critical alert{'s' if e.critical_firing != 1 else ''} firing")
    if e.up is False:
        words.append("down: Prometheus cannot scrape it")
    if e.capacity_exceeds:
        words.append("context window exceeds a pool")
    if e.restarts_15m > 0:
        words.append(f"{count_words(e.restarts_15m)} worker restarts in 15 min")
    if e.defences_off:
        words.append(f"{e.defences_off} defence{'s' if e.defences_off != 1 else ''} off")
    if e.faults_on:
        words.append(f"{e.faults_on} fault{'s' if e.faults_on != 1 else ''} on")
    return "; ".join(words) or "healthy"


def count_words(value: float) -> str:
    """A count from Prometheus's increase(), which extrapolates to the window's edges and so
    gives 323.395 for 323 events: shown whole ("about" when it was not), with thousands marked."""
    whole = round(value)
    return f"{whole:,}" if abs(value - whole) < 1e-9 else f"about {whole:,}"


def model_words(model: str) -> str:
    """A model as a person names it: the checkpoint directory's name, not its whole path."""
    return model.rstrip("/").rsplit("/", 1)[-1] if model else "–"


def fleet_rows(snapshot: FleetSnapshot) -> list[FleetRow]:
    """The snapshot's engines, most urgent first, ties by name."""
    rows = [FleetRow(e, urgency_of(e), finding_of(e)) for e in snapshot.rows]
    return sorted(rows, key=lambda r: (r.urgency, r.engine.instance))


def age_words(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    if seconds < 172800:
        return f"{seconds // 3600} h"
    return f"{seconds // 86400} d"


class FleetModel:
    """The rows shown and the words of the status line; a failed refresh keeps the rows."""

    def __init__(self, url: str = ""):
        self.url = url
        self.rows: list[FleetRow] = []
        self.last_good: FleetSnapshot | None = None
        self.last: FleetSnapshot | None = None

    def update(self, snapshot: FleetSnapshot) -> bool:
        """Take a refresh's result; True when the rows changed (a failure keeps them)."""
        self.last = snapshot
        if not snapshot.ok:
            return False
        self.last_good = snapshot
        self.rows = fleet_rows(snapshot)
        return True

    def status_text(self, now: float | None = None) -> str:
        """Prometheus URL, last refresh, query time; or the error and how old the rows are."""
        now = time.time() if now is None else now
        last, good = self.last, self.last_good
        if last is None:
            return f"Prometheus {self.url}: asking…"
        count = f"{len(self.rows)} engine{'s' if len(self.rows) != 1 else ''}"
        if good is not None and good.left_out:
            count += f" ({good.left_out} left out)"
        if last.ok:
            return (f"Prometheus {self.url} · {count} · refreshed {time.strftime('%H:%M:%S', time.localtime(last.taken))}"
                    f" · queries took {last.took_s * 1000:.0f} ms")
        kept = (f"showing rows {age_words(now - good.taken)} old" if good is not None else "no rows yet")
        error = last.error if self.url in str(last.error) else f"Prometheus {self.url}: {last.error}"
        return f"{error} · {kept}"

    @property
    def failing(self) -> bool:
        return self.last is not None and not self.last.ok
