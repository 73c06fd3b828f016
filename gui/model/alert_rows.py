"""AlertRow: one alert episode as the engine reports it, and the app's own restart markers (Qt-free).

The engine numbers the episodes of an alert (`episode`, from 1) and names each by `key`
(`"{id}#{episode}"`): a later episode of the same alert is another row, never an overwrite.
A record without `key` (an engine before episodes) is keyed by its `id`. Records read back
from an earlier engine run carry `previous_run`. The `requests` and `pages` lists hold the
newest few; `requests_total` and `pages_total` say how many the episode named in all.

The app invents no alert; the one row it adds is a marker that the engine restarted
(`marker=True`), so that the alerts read in order around the outage.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from engine.wire.states import AlertState

MARKER_KIND = "engine_restarted"


@dataclass
class AlertRow:
    """One alert episode (the GUI invents none; `marker` rows are the app's own notes)."""

    id: str  # the row's key: the engine's `key`, else its `id`
    kind: str
    severity: str
    state: str  # an AlertState
    acked: bool
    first_seen: float
    last_seen: float
    count: int
    requests: list[str]
    pages: list[int]
    detail: str
    pool: str | None = None
    previous_engine: bool = False  # raised by an engine that has since gone (restarted or replaced)
    alert_id: str = ""  # the engine's `id`, which every episode of the alert shares ("" = id)
    episode: int | None = None
    previous_run: bool = False  # read back by the engine from an earlier run's journal
    run: str = ""  # the engine run that raised it, where the engine says ("" = the one answering now)
    requests_total: int | None = None  # requests the episode named in all (None: the list is all)
    pages_total: int | None = None
    marker: bool = False  # not an alert: the app's note that the engine restarted here
    prevented: bool | None = None  # True: every event of it was stopped before data crossed (None: not said)

    @property
    def ack_id(self) -> str:
        """What the engine acknowledges: the episode's key (its `id` where it has none)."""
        return self.id

    @property
    def gone(self) -> bool:
        """Raised by an engine that no longer runs (this window saw it go, or the engine says so)."""
        return self.previous_engine or self.previous_run

    @property
    def ackable(self) -> bool:
        return not self.acked and not self.previous_engine and not self.marker

    @property
    def live_firing(self) -> bool:
        """Firing on the engine answering now."""
        return self.state == AlertState.FIRING and not self.gone and not self.marker

    @property
    def requests_left_out(self) -> int:
        """How many requests the episode named beyond those listed (0: the list is whole)."""
        return _left_out(self.requests_total, len(self.requests))

    @property
    def pages_left_out(self) -> int:
        return _left_out(self.pages_total, len(self.pages))


def _left_out(total, listed: int) -> int:
    return max(0, int(total) - listed) if isinstance(total, int) and not isinstance(total, bool) else 0


def _number(value, default: float) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def _count(value) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def alert_row(msg) -> AlertRow:
    """An AlertRow from one `alerts` record (a telemetry message or a status entry)."""
    engine_id = str(msg.get("id") or f"{msg.get('kind')}:{msg.get('seq')}")
    key = msg.get("key")
    key = str(key) if key else engine_id
    episode = msg.get("episode")
    t = _number(msg.get("time"), 0.0)
    return AlertRow(
        key, str(msg.get("kind", "")), str(msg.get("severity", "warning")), str(msg.get("state", AlertState.FIRING)),
        bool(msg.get("acked", False)), _number(msg.get("first_seen"), t), _number(msg.get("last_seen"), t),
        int(msg.get("count", 1)), [str(r) for r in msg.get("requests") or []],
        [int(p) for p in msg.get("pages") or []], str(msg.get("detail", "")), msg.get("pool"),
        alert_id=engine_id, episode=episode if isinstance(episode, int) and not isinstance(episode, bool) else None,
        previous_run=bool(msg.get("previous_run", False)),
        run=str(msg.get("run") or "") if msg.get("previous_run") else "",
        requests_total=_count(msg.get("requests_total")), pages_total=_count(msg.get("pages_total")),
        prevented=msg.get("prevented") if isinstance(msg.get("prevented"), bool) else None,
    )


def restart_marker(number: int, at: float, previous_started: float | None, started: float | None) -> AlertRow:
    """The row that marks an engine restart seen at wall time `at` (the app's note, not an alert)."""
    def clock(t):
        return dt.datetime.fromtimestamp(t).strftime("%H:%M:%S") if t else "?"

    when = started or at
    detail = (f"engine restarted at {clock(when)} (the run before started at {clock(previous_started)}); "
              "alerts below this row are the previous run's")
    return AlertRow(f"restart:{number}", MARKER_KIND, "info", "restarted", True, when, when, 1, [], [],
                    detail, marker=True)


@dataclass(frozen=True)
class RestartMark:
    """An engine restart: when the new run began on this window's monotonic clock (the plots'),
    when the window saw it (wall time), and the engine's own start time."""

    monotonic: float
    wall: float
    started: float | None = None
