"""What a snapshot's state says happened, as plain values: alert episodes, rejected and
placeholder requests, the tenants of the affected pairs, page ranges, and whether the
defences prevented the crossing. The report prints these; the tests check them against
the engine's ground truth. Pure Python (no Qt).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from engine.wire.alert_kinds import ISOLATION_KINDS, PREVENTED_BY_FIRING_KINDS, REACHES_REPLY_KINDS
from engine.wire.defences import DEFENCES, FAULTS, Switch
from engine.wire.states import END_PHASES, STOPPED_PHASES, Phase
from gui.model.scope_summary import TenantPair, pages_by_pool, tenant_pairs, with_tenants

# An alert record keeps the newest 50 requests and pages it named (the engine's AlertBook);
# an engine that does not send requests_total / pages_total leaves the rest uncounted.
ENGINE_LIST_CAP = 50
# Kinds whose very firing means the defence stopped the data (the engine sends no `prevented`)
PREVENTED_BY_KIND = PREVENTED_BY_FIRING_KINDS
# Kinds that say a request read (or answered with) data not its own: not prevented, it reached a
# response. The others (a transfer accepted despite its manifest, a late write landed) put data
# where it does not belong, and a later defence may still stop every request they name.
READ_KINDS = REACHES_REPLY_KINDS


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# ---- requests ----------------------------------------------------------------------------


def phase(request: dict) -> str:
    """A request's phase; where the record has no Phase (a request the engine no longer
    tracks, known by its events only), its last ending event, else what it says."""
    value = str(request.get("phase"))
    if value in tuple(Phase):
        return value
    ends = [e.get("event") for e in request.get("events") or [] if e.get("event") in END_PHASES]
    return ends[-1] if ends else value


def _event(request: dict, name: str) -> dict | None:
    return next((e for e in request.get("events") or [] if isinstance(e, dict) and e.get("event") == name), None)


def is_placeholder(request: dict) -> bool:
    """Rejected by admission but served from a placeholder (the placeholder_on_reject fault)."""
    return request.get("placeholder") is True or _event(request, "placeholder") is not None


def _all_requests(state: dict) -> list[dict]:
    """The state's requests, plus placeholder requests the engine had forgotten by the export:
    its history op then sends their events as an engine-event group named by the request id."""
    requests = [r for r in state.get("requests") or [] if isinstance(r, dict)]
    known = {r.get("request_id") for r in requests}
    for group in state.get("engine_events") or []:
        subject = group.get("subject") if isinstance(group, dict) else None
        if subject and subject not in known and any(
                isinstance(e, dict) and e.get("event") == "placeholder" for e in group.get("events") or []):
            events = group.get("events") or []
            requests.append({"request_id": subject, "phase": "forgotten", "events": events,
                             "arrival": events[0].get("time") if events else None})
    return requests


def placeholder_requests(state: dict) -> list[dict]:
    """Requests rejected by admission but served from a placeholder, earliest first."""
    return sorted((r for r in _all_requests(state) if is_placeholder(r)), key=_arrival)


def rejected_requests(state: dict) -> list[dict]:
    """Requests refused outright (no reply served; not placeholders), earliest first."""
    return sorted((r for r in _all_requests(state) if phase(r) == "rejected" and not is_placeholder(r)),
                  key=_arrival)


def failed_requests(state: dict) -> list[dict]:
    return sorted((r for r in _all_requests(state) if phase(r) == "failed"), key=_arrival)


def rejection_of(request: dict) -> dict:
    """Why a request was rejected: {code, message, time} from its `placeholder` or `rejected`
    event (the placeholder's message is the admission refusal it stood in for)."""
    event = _event(request, "placeholder") or _event(request, "rejected") or {}
    code = event.get("code") or ("admission_rejected" if event.get("event") == "placeholder" else None)
    return {"code": code, "message": event.get("message"), "time": event.get("time")}


def _arrival(request: dict) -> float:
    value = request.get("arrival")
    return value if is_number(value) else float("inf")


def tenant_lookup(state: dict) -> Callable[[str], "str | None"]:
    """request id -> its tenant, from the requests (or their `admitted` event) and the prompt log."""
    tenants: dict[str, str] = {}
    for entry in state.get("prompt_log") or []:
        if isinstance(entry, dict) and entry.get("request_id") and entry.get("tenant"):
            tenants[str(entry["request_id"])] = str(entry["tenant"])
    for request in _all_requests(state):
        rid = request.get("request_id")
        tenant = request.get("tenant") or (_event(request, "admitted") or {}).get("tenant")
        if rid and tenant:
            tenants[str(rid)] = str(tenant)
    return tenants.get


# ---- pairs, tenants and pages --------------------------------------------------------------


def affected_pairs(state: dict) -> list[dict]:
    """The scope's pairs with reader_tenant / source_tenant filled where anything knows them."""
    return with_tenants((state.get("scope") or {}).get("pairs") or [], tenant_lookup(state))


def tenant_groups(state: dict) -> list[TenantPair]:
    """The affected pairs per (reader tenant, source tenant), the earliest crossing first."""
    return tenant_pairs(affected_pairs(state))


def page_runs(pages: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted distinct page numbers as runs of consecutive pages: [12..19], [33]."""
    runs: list[tuple[int, int]] = []
    for page in sorted({int(p) for p in pages}):
        if runs and page == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], page)
        else:
            runs.append((page, page))
    return runs


@dataclass(frozen=True)
class PageRanges:
    """One pool's pages as ranges, the first `shown` of them printed."""

    pool: str | None
    runs: tuple[tuple[int, int], ...]
    shown: int

    @property
    def pages(self) -> int:
        return sum(b - a + 1 for a, b in self.runs)

    @property
    def left_out_pages(self) -> int:
        return sum(b - a + 1 for a, b in self.runs[self.shown:])

    @property
    def text(self) -> str:
        """"decode-0: 12–19, 33" (the pool left out when None)."""
        body = ", ".join(f"{a}" if a == b else f"{a}\u2013{b}" for a, b in self.runs[:self.shown])
        return f"{self.pool}: {body}" if self.pool is not None else body


def pool_ranges(pages: Iterable, limit: int) -> list[PageRanges]:
    """[[pool, page], …] per pool (sorted by name), at most `limit` ranges printed per pool."""
    by_pool = pages_by_pool(pages)
    return [PageRanges(pool, tuple(runs), min(limit, len(runs)))
            for pool, runs in ((p, page_runs(n)) for p, n in sorted(by_pool.items()))]


def plain_ranges(pages: Iterable, limit: int) -> PageRanges:
    """Page numbers of no named pool (an alert's) as ranges."""
    runs = page_runs(p for p in pages if is_number(p))
    return PageRanges(None, tuple(runs), min(limit, len(runs)))


# ---- alert episodes --------------------------------------------------------------------------


@dataclass(frozen=True)
class Named:
    """What an alert record lists of the requests (or pages) it named, and what it left out."""

    listed: tuple  # what the record keeps (the engine keeps the newest ENGINE_LIST_CAP)
    total: int | None  # distinct ever named, when the engine says (requests_total / pages_total)

    @property
    def known_total(self) -> int:
        return max(self.total or 0, len(self.listed))

    @property
    def not_kept(self) -> int:
        """Named by the alert but not in the bundle (0 when the engine did not say how many)."""
        return self.known_total - len(self.listed)

    @property
    def uncounted(self) -> bool:
        """The list is at the engine's cap and the engine did not say how many in all."""
        return self.total is None and len(self.listed) >= ENGINE_LIST_CAP


@dataclass(frozen=True)
class Episode:
    record: dict
    id: str
    number: int  # 1 for the first episode of its id
    of: int  # episodes of that id in the bundle
    key: str
    previous_run: bool
    requests: Named
    pages: Named

    @property
    def prevented(self) -> bool | None:
        """True: every violation it counts was masked or aborted; False: not; None: not said."""
        value = self.record.get("prevented")
        if isinstance(value, bool):
            return value
        return True if self.record.get("kind") in PREVENTED_BY_KIND else None


def episodes(alerts: Iterable[dict]) -> list[Episode]:
    """One Episode per alert record, earliest first. Records from an engine that sends no
    `episode` are numbered per id by when they were first seen."""
    records = [a for a in alerts if isinstance(a, dict)]
    by_id: dict[str, list[dict]] = {}
    for record in records:
        by_id.setdefault(str(record.get("id") or record.get("kind") or "?"), []).append(record)
    out = []
    for aid, group in by_id.items():
        group.sort(key=lambda r: (r.get("episode") if isinstance(r.get("episode"), int) else 0,
                                  r["first_seen"] if is_number(r.get("first_seen")) else 0.0))
        for i, record in enumerate(group, 1):
            number = record.get("episode") if isinstance(record.get("episode"), int) else i
            total = max([len(group), *(r.get("episode") for r in group if isinstance(r.get("episode"), int))])
            out.append(Episode(
                record, aid, number, total, str(record.get("key") or f"{aid}#{number}"),
                record.get("previous_run") is True,
                Named(tuple(record.get("requests") or ()), _count(record.get("requests_total"))),
                Named(tuple(record.get("pages") or ()), _count(record.get("pages_total")))))
    return sorted(out, key=lambda e: (e.record["first_seen"] if is_number(e.record.get("first_seen")) else 0.0,
                                      e.id, e.number))


def _count(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


# ---- what happened ---------------------------------------------------------------------------


NOT_PREVENTED, PREVENTED, NOTHING_CROSSED = "not_prevented", "prevented", "nothing_crossed"


@dataclass(frozen=True)
class Outcome:
    """Whether data reached responses, by the scope and the isolation alerts."""

    kind: str  # NOT_PREVENTED, PREVENTED or NOTHING_CROSSED
    readers: tuple[str, ...]  # responses that carried other requests' data (scope readers)
    groups: tuple[TenantPair, ...]
    isolation: tuple[Episode, ...]  # isolation alert episodes
    reached: tuple[Episode, ...]  # not shown prevented: their data may have reached a response
    stopped_later: tuple[Episode, ...]  # their own defence was off, a later one stopped every request named
    defences_off: tuple[Switch, ...] = ()  # at export time (the manifest's config)
    faults_on: tuple[Switch, ...] = ()
    ownership_policy: str | None = None
    placeholders: tuple[dict, ...] = field(default=())

    @property
    def reader_tenants(self) -> tuple[str | None, ...]:
        return tuple(dict.fromkeys(g.reader_tenant for g in self.groups))

    @property
    def source_tenants(self) -> tuple[str | None, ...]:
        return tuple(dict.fromkeys(g.writer_tenant for g in self.groups))


def outcome(state: dict, manifest: dict | None = None) -> Outcome:
    """NOT_PREVENTED when any request read another's data (a scope pair) or an isolation alert
    is not shown prevented; PREVENTED when isolation alerts fired and each says its violations
    were masked or aborted, or names only requests a later defence stopped; else
    NOTHING_CROSSED. On doubt, never the milder one."""
    pairs = affected_pairs(state)
    by_time = sorted(pairs, key=lambda p: p["first"] if is_number(p.get("first")) else float("inf"))
    readers = tuple(dict.fromkeys(str(p["reader"]) for p in by_time if p.get("reader") is not None))  # first hit first
    isolation = tuple(e for e in episodes(state.get("alerts") or []) if e.record.get("kind") in ISOLATION_KINDS)
    ended = {str(r.get("request_id")): phase(r) for r in _all_requests(state)}

    def stopped(e: Episode) -> bool:
        named = e.requests
        return (e.record.get("kind") not in READ_KINDS and bool(named.listed) and not named.not_kept
                and not named.uncounted and all(ended.get(str(r)) in STOPPED_PHASES for r in named.listed))

    later = tuple(e for e in isolation if e.prevented is not True and stopped(e))
    reached = tuple(e for e in isolation if e.prevented is not True and e not in later)
    config = (manifest or {}).get("config") or {}
    defences, faults = config.get("defences") or {}, config.get("faults") or {}
    off = tuple(d for d in DEFENCES if defences.get(d.name) is False)
    on = tuple(f for f in FAULTS if faults.get(f.name) is True)
    policy = (config.get("engine") or {}).get("ownership_policy")
    kind = NOT_PREVENTED if readers or reached else PREVENTED if isolation else NOTHING_CROSSED
    return Outcome(kind, readers, tuple(tenant_pairs(pairs)), isolation, reached, later, off, on, policy,
                   tuple(placeholder_requests(state)))
