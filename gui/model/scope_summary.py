"""The incident scope said per tenant: which tenant received whose data, through which request
pairs and pages, and when — as plain text (a ticket, a chat) and as a JSON-able document. Qt-free.

A pair is one of the engine's `scope` answer (ReadLog.scope, tenants added by the control ops):
reader, source (None: not known by now), source_slot, pages ([pool, page] each), first, last
(wall-clock seconds), reads, and reader_tenant / source_tenant where the engine still knew the
requests. A pair without them (a snapshot from an older engine) takes them from `tenant_of`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timezone

from gui.model.crossings import tenant_sentence
from gui.model.engine_state import AlertRow

TenantOf = Callable[[str], "str | None"]  # request id -> its tenant (None: not known)
MAX_TEXT_PAGES = 48  # page numbers (or ranges) per pool in one text line; the JSON has them all


def utc(t) -> str:
    """Unix seconds as UTC ISO 8601 with milliseconds ("" for no time)."""
    if not isinstance(t, (int, float)) or isinstance(t, bool):
        return ""
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def with_tenants(pairs: Iterable[dict], tenant_of: TenantOf | None = None) -> list[dict]:
    """Copies of `pairs` with reader_tenant and source_tenant filled where known (None otherwise)."""
    def tenant(pair: dict, side: str) -> str | None:
        known = pair.get(f"{side}_tenant")
        rid = pair.get(side)
        if not known and rid and tenant_of is not None:
            known = tenant_of(rid)
        return known or None

    return [{**p, "reader_tenant": tenant(p, "reader"), "source_tenant": tenant(p, "source")}
            for p in pairs if isinstance(p, dict)]


@dataclass(frozen=True)
class TenantPair:
    """Every request pair in which `reader_tenant` received `writer_tenant`'s data."""

    reader_tenant: str | None
    writer_tenant: str | None
    pairs: tuple[dict, ...]  # with tenants filled, earliest first

    @property
    def sentence(self) -> str:
        return tenant_sentence(self.reader_tenant, self.writer_tenant)

    @property
    def first(self) -> float | None:
        return min((p["first"] for p in self.pairs if _is_time(p.get("first"))), default=None)

    @property
    def last(self) -> float | None:
        return max((p["last"] for p in self.pairs if _is_time(p.get("last"))), default=None)

    @property
    def reads(self) -> int:
        return sum(int(p.get("reads") or 0) for p in self.pairs)

    @property
    def pages(self) -> int:
        """Distinct pages read across its request pairs."""
        return len({tuple(page) for p in self.pairs for page in p.get("pages") or []})


def tenant_pairs(pairs: Iterable[dict], tenant_of: TenantOf | None = None) -> list[TenantPair]:
    """The pairs grouped by (reader tenant, writer tenant), the earliest crossing first."""
    groups: dict[tuple, list[dict]] = {}
    for pair in with_tenants(pairs, tenant_of):
        groups.setdefault((pair["reader_tenant"], pair["source_tenant"]), []).append(pair)
    out = [TenantPair(r, w, tuple(sorted(ps, key=_start))) for (r, w), ps in groups.items()]
    return sorted(out, key=lambda tp: (tp.first if tp.first is not None else float("inf"),
                                       tp.reader_tenant or "", tp.writer_tenant or ""))


def request_name(pair: dict, side: str) -> str:
    """The reader's or source's request id; an unknown source is named by its slot."""
    rid = pair.get(side)
    if rid:
        return str(rid)
    return f"an unknown request (slot {pair.get(f'{side}_slot', '?')})"


def pages_by_pool(pages: Iterable) -> dict[str, list[int]]:
    """[[pool, page], …] as pool -> its page numbers (malformed items skipped)."""
    by_pool: dict[str, list[int]] = {}
    for item in pages:
        try:
            pool, page = item
            by_pool.setdefault(str(pool), []).append(int(page))
        except (TypeError, ValueError):
            continue
    return by_pool


def page_text(pages: Iterable) -> str:
    """[[pool, page], …] as "decode-0:4-6,9; prefill-0:2" (consecutive pages as ranges)."""
    by_pool = pages_by_pool(pages)
    parts = []
    for pool in sorted(by_pool):
        runs = _runs(sorted(set(by_pool[pool])))
        shown = ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:MAX_TEXT_PAGES])
        more = f" … (+{len(runs) - MAX_TEXT_PAGES} more)" if len(runs) > MAX_TEXT_PAGES else ""
        parts.append(f"{pool}:{shown}{more}")
    return "; ".join(parts) or "no pages"


def pair_text(pair: dict) -> str:
    """One request pair: who received whose data, through which pages, how often, when."""
    return (f"{request_name(pair, 'reader')} received data of {request_name(pair, 'source')} "
            f"(pages {page_text(pair.get('pages') or [])}; {int(pair.get('reads') or 0):,} read(s); "
            f"{utc(pair.get('first'))} – {utc(pair.get('last'))})")


def scope_text(alert: AlertRow | None, pairs: Iterable[dict], tenant_of: TenantOf | None = None) -> str:
    """The scope as plain text: a heading line, then one line per tenant pair with its
    request pairs, pages and first/last time."""
    groups = tenant_pairs(pairs, tenant_of)
    count = sum(len(g.pairs) for g in groups)
    head = "Incident scope"
    if alert is not None:
        head += (f" of alert {alert.id} ({alert.kind}, {alert.severity}, "
                 f"{utc(alert.first_seen)} – {utc(alert.last_seen)})")
    if not groups:
        return f"{head}: no request received another request's data in this window.\n"
    lines = [f"{head}: {len(groups)} tenant pair(s), {count} request pair(s)"]
    for g in groups:
        lines.append(f"{g.sentence}: {len(g.pairs)} request pair(s), first {utc(g.first)}, last {utc(g.last)}: "
                     + "; ".join(pair_text(p) for p in g.pairs))
    return "\n".join(lines) + "\n"


def scope_document(alert: AlertRow | None, pairs: Iterable[dict], tenant_of: TenantOf | None = None) -> dict:
    """The scope as a JSON-able dict: {"alert": …, "tenant_pairs": […], "pairs": […]}; each tenant
    pair lists its request pairs by reader and source, the top-level pairs are whole."""
    full = with_tenants(pairs, tenant_of)
    groups = tenant_pairs(full)
    return {
        "alert": None if alert is None else {
            "id": alert.id, "kind": alert.kind, "severity": alert.severity, "state": alert.state,
            "first_seen": alert.first_seen, "last_seen": alert.last_seen, "count": alert.count,
            "requests": list(alert.requests), "pool": alert.pool},
        "tenant_pairs": [{
            "reader_tenant": g.reader_tenant, "writer_tenant": g.writer_tenant, "summary": g.sentence,
            "first": g.first, "last": g.last, "first_utc": utc(g.first), "last_utc": utc(g.last),
            "reads": g.reads, "pages": g.pages,
            "pairs": [{"reader": p.get("reader"), "source": p.get("source"), "source_slot": p.get("source_slot")}
                      for p in g.pairs],
        } for g in groups],
        "pairs": full,
    }


def _is_time(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _start(pair: dict) -> float:
    return pair["first"] if _is_time(pair.get("first")) else float("inf")


def _runs(numbers: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], n)
        else:
            runs.append((n, n))
    return runs
