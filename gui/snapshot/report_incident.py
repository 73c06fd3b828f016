"""The sections of `report.html` that say what the incident was: what happened and what to do
next (chosen by whether the defences prevented it), the rejected and placeholder requests,
the affected pairs with their tenants and page ranges, and every alert episode.

Every list that is cut says how many it left out. Pure Python (no Qt).
"""

from __future__ import annotations

from engine.wire.defences import Switch
from engine.wire.states import STOPPED_PHASES
from gui.snapshot import incident_facts as facts
from gui.snapshot.report_html import Html, badge, code, esc, more, section, table, time_cell

NAMES_SHOWN = 20  # request ids in one sentence of the runbook
CELL_NAMES = 12  # request ids in one table cell
CELL_RANGES = 24  # page ranges per pool in one table cell


def id_list(ids, limit: int, why: str = "") -> Html:
    """Request ids as code, the first `limit` of them, then "+N more"."""
    ids = [str(i) for i in ids]
    shown = ", ".join(str(code(i)) for i in ids[:limit])
    return Html(shown + more(len(ids) - limit, "more", why))


def ranges_cell(ranges: list[facts.PageRanges], left_out_why: str = "in state.json") -> Html:
    """Pages per pool as ranges ("decode-0: 12–19, 33"), each pool cut at its shown ranges."""
    parts = []
    for r in ranges:
        parts.append(esc(r.text)
                     + more(r.left_out_pages, "more pages" if r.left_out_pages != 1 else "more page", left_out_why))
    return Html("; ".join(parts) or '<span class="muted">none</span>')


def _switches(switches: tuple[Switch, ...]) -> str:
    return "; ".join(f"{s.label} ({s.name})" for s in switches)


# ---- what happened and what to do next ----------------------------------------------------


def _defence_lines(o: facts.Outcome) -> str:
    lines = []
    if o.defences_off:
        lines.append(f"<li>Defences <b>off</b>: {esc(_switches(o.defences_off))}</li>")
    if o.faults_on:
        lines.append(f"<li>Faults <b>on</b>: {esc(_switches(o.faults_on))}</li>")
    if o.ownership_policy and o.ownership_policy != "abort":
        lines.append(f"<li>Ownership policy <code>{esc(o.ownership_policy)}</code>: violations are reported, "
                     "not aborted</li>")
    if not lines:
        return "<p>At export time every defence was on and no fault was on.</p>"
    return ("<p>At export time (the configuration in the manifest; a reconfigure before the export would "
            f"not show here):</p><ul>{''.join(lines)}</ul>")


def _turn_back(o: facts.Outcome) -> str:
    parts = []
    if o.defences_off:
        parts.append("turn " + ", ".join(s.name for s in o.defences_off) + " back on")
    if o.faults_on:
        parts.append("turn " + ", ".join(s.name for s in o.faults_on) + " off")
    if o.ownership_policy and o.ownership_policy != "abort":
        parts.append('set engine.ownership_policy = "abort"')
    return " and ".join(parts)


def _placeholder_step(o: facts.Outcome) -> str:
    if not o.placeholders:
        return ""
    return (f"<li>{len(o.placeholders):,} request(s) rejected by admission were served from a placeholder (the "
            f"2026 incident's path; listed under Rejected and placeholder requests): turn placeholder_on_reject "
            f"off, and make the context window fit every pool (Capacity findings).</li>")


def _episode_names(episodes) -> Html:
    return Html(", ".join(str(code(e.key)) for e in episodes[:NAMES_SHOWN])
                + more(len(episodes) - NAMES_SHOWN, "more episodes"))


def what_happened(state: dict, manifest: dict) -> str:
    """The outcome in one line, the evidence for it, and the runbook for that outcome."""
    o = facts.outcome(state, manifest)
    if o.kind == facts.NOT_PREVENTED:
        return section("What happened: NOT prevented", _not_prevented(o), "outcome-bad runbook", "what-happened")
    if o.kind == facts.PREVENTED:
        return section("What happened: prevented", _prevented(o, state), "outcome-ok runbook", "what-happened")
    return section("What happened: no isolation failure", _nothing(o), "outcome-none runbook", "what-happened")


def _not_prevented(o: facts.Outcome) -> str:
    n = len(o.readers)
    if n:
        noun = "response" if n == 1 else "responses"
        head = f"Other requests' data reached {n:,} {noun}: no defence stopped it."
        tenants = "; ".join(f"{g.sentence} ({len(g.pairs):,} request pair(s))" for g in o.groups[:NAMES_SHOWN])
        body = (f"<p>The {noun} of {id_list(o.readers, NAMES_SHOWN)} carried data other requests wrote. "
                f"By tenant: {esc(tenants)}{more(len(o.groups) - NAMES_SHOWN, 'more tenant pairs')}.</p>")
    else:
        head = "Isolation alerts say data crossed and was not prevented; no cross read was logged in this window."
        body = ("<p>Export a wider window to name the responses; until then treat the requests the alerts "
                "below name as affected.</p>")
    unsure = [e for e in o.reached if e.prevented is None]
    if o.reached:
        body += (f"<p>Alert episodes not shown prevented: {_episode_names(o.reached)}"
                 f"{' (some do not say either way: counted as not prevented)' if unsure else ''}.</p>")
    steps = []
    if n:
        steps.append(f"<li>Treat the replies of these {n:,} {'response' if n == 1 else 'responses'} as leaked: "
                     "they went out to their clients with other requests' data; nothing was aborted.</li>")
    else:
        steps.append("<li>Treat the replies of the requests the not-prevented alerts name as leaked.</li>")
    if o.groups:
        steps.append("<li>Notify the owners of the tenants in <a href=\"#pairs\">Affected pairs</a> (each line "
                     "says which tenant received whose data) and attach this bundle to the incident ticket.</li>")
    turn = _turn_back(o)
    steps.append("<li>Stop new traffic to this engine (drain it at the load balancer) until the cause is fixed"
                 + (f": {esc(turn)} (Reconfigure, Ctrl+R)" if turn else
                    ". Every defence was on: this is an engine bug; file it with this bundle") + ".</li>")
    steps.append(_placeholder_step(o))
    steps.append("<li>Keep this bundle unchanged: its files and their SHA-256 are listed at the end.</li>")
    return (f'<p class="headline bad">{esc(head)}</p>{body}{_defence_lines(o)}'
            f"<h3>What to do next</h3><ol>{''.join(steps)}</ol>")


def _prevented(o: facts.Outcome, state: dict) -> str:
    named = list(dict.fromkeys(str(r) for e in o.isolation for r in e.requests.listed))
    ended = {str(r.get("request_id")): facts.phase(r) for r in state.get("requests") or []}
    aborted = [r for r in named if ended.get(r) in STOPPED_PHASES]
    others = [r for r in named if r not in aborted]
    head = "Every isolation violation was stopped before another request's data reached a response."
    body = (f"<p>{len(o.isolation):,} isolation alert episode(s) fired ({_episode_names(o.isolation)}); no "
            f"cross read reached a response in this window.</p>")
    if o.stopped_later:
        body += (f"<p>{_episode_names(o.stopped_later)}: its own defence did not stop it, but every request it "
                 "names failed before an answer went out (a later defence stopped them).</p>")
    step = "<li>No request the alerts name received another request's data."
    if aborted:
        step = (f"<li>{len(aborted):,} request(s) met data not their own and were masked and failed before it "
                f"went out ({id_list(aborted, NAMES_SHOWN)}): their clients got an error, not another request's "
                "data.")
    if others and aborted:
        step += (f" The other {len(others):,} request(s) the alerts name ended normally: an ownership alert names "
                 "the writers of the pages met beside the reader, and their data did not leave.")
    steps = [step + " Nobody needs notifying.</li>"]
    turn = _turn_back(o)
    if turn:
        steps.append(f"<li>Something still tried to cross, and a weakened configuration is the first suspect: "
                     f"{esc(turn)} (Reconfigure, Ctrl+R).</li>")
    else:
        steps.append("<li>Every defence was on and no fault: the defences did their job. If it repeats, it is "
                     "an engine bug: file it with this bundle.</li>")
    steps.append(_placeholder_step(o))
    return (f'<p class="headline ok">{esc(head)}</p>{body}{_defence_lines(o)}'
            f"<h3>What to do next</h3><ol>{''.join(steps)}</ol>")


def _nothing(o: facts.Outcome) -> str:
    head = "No isolation alert fired and no request received another request's data in this window."
    steps = [_placeholder_step(o)]
    turn = _turn_back(o)
    if turn:
        steps.append(f"<li>The engine runs weakened: {esc(turn)} (Reconfigure, Ctrl+R).</li>")
    steps = [s for s in steps if s]
    todo = f"<h3>What to do next</h3><ol>{''.join(steps)}</ol>" if steps else ""
    return f'<p class="headline ok">{esc(head)}</p>{_defence_lines(o)}{todo}'


# ---- rejected and placeholder requests -------------------------------------------------------


def _received(request: dict, readers: dict[str, list[str]]) -> Html:
    rid = str(request.get("request_id"))
    if rid in readers:
        return Html(str(badge("yes", "leaked")) + " from " + id_list(readers[rid], CELL_NAMES))
    err = request.get("error") if isinstance(request.get("error"), dict) else {}
    if facts.phase(request) == "failed":
        return Html(f"{badge('no', 'prevented')} failed: {esc(err.get('code') or '?')}")
    return Html('<span class="muted">no cross read logged</span>')


def rejected(state: dict) -> str:
    placeholders = facts.placeholder_requests(state)
    refused = facts.rejected_requests(state)
    failed = facts.failed_requests(state)
    readers: dict[str, list[str]] = {}
    for pair in facts.affected_pairs(state):
        readers.setdefault(str(pair.get("reader")), []).append(str(pair.get("source") or
                                                                     f"slot {pair.get('source_slot')}"))
    leaked = sum(str(r.get("request_id")) in readers for r in placeholders)
    counts = (f"{len(placeholders):,} request(s) rejected by admission but served from a placeholder \u2014 the "
              f"incident's path ({leaked:,} of them received other requests' data); {len(refused):,} rejected "
              f"outright (no reply served); {len(failed):,} failed.")
    cls = "warn" if placeholders else ""
    rows = [[code(r.get("request_id")), r.get("tenant"), badge(facts.phase(r)), r.get("tokens"), _received(r, readers),
             facts.rejection_of(r)["message"], time_cell(facts.rejection_of(r)["time"])] for r in placeholders]
    body = (f'<p class="{cls}">{esc(counts)}</p>'
            f"<h3>Rejected by admission but served from a placeholder ({len(placeholders):,})</h3>"
            "<p class=\"muted\">The placeholder went through prefill and decode over pages reserved for the whole "
            "request: what it read there was other requests' data unless a defence stopped it.</p>"
            + table(["Request", "Tenant", "Phase", "Tokens generated", "Received other requests' data",
                     "Rejected because", "When"], rows, "No request was served from a placeholder.",
                    numeric=(3,), what="placeholder requests"))
    rows = []
    for r in refused:
        why = facts.rejection_of(r)
        rows.append([code(r.get("request_id")), r.get("tenant"), why["code"], why["message"], time_cell(why["time"])])
    empty = ("No other request was rejected (the placeholder requests above were rejected, then served)."
             if placeholders else "No request was rejected.")
    body += (f"<h3>Rejected, no reply served ({len(refused):,})</h3>"
             + table(["Request", "Tenant", "Code", "Message", "When"], rows, empty, what="rejected requests"))
    return section("Rejected and placeholder requests", body, anchor="rejected")


# ---- affected pairs ------------------------------------------------------------------------


def pairs(state: dict) -> str:
    scope = state.get("scope") or {}
    # each response's sources together, in the order they were first read
    full = sorted(facts.affected_pairs(state), key=lambda p: (
        p.get("reader_slot") if isinstance(p.get("reader_slot"), int) else 0,
        p["first"] if facts.is_number(p.get("first")) else 0.0))
    groups = facts.tenant_groups(state)
    crossed = facts.outcome(state).reached
    if crossed:  # never "nothing crossed" beside an alert that says it did
        empty = (f"No cross read was logged in this window, but {len(crossed)} isolation alert(s) say data "
                 f"crossed and was not prevented (see Alerts): export a wider window to scope them.")
    else:
        empty = "No request read another request's data in this window."
    note = ""
    if scope.get("incomplete_before") is not None:
        note = (f'<p class="warn">Incomplete: {scope.get("dropped_reads", 0):,} reads up to '
                f"{esc(time_cell(scope['incomplete_before']))} were dropped for room; pairs before then may be "
                f"missing.</p>")
    group_rows = [[g.sentence, len(g.pairs), g.reads,
                   sum(r.pages for r in facts.pool_ranges((page for p in g.pairs for page in p.get("pages") or []), 0)),
                   time_cell(g.first), time_cell(g.last)] for g in groups]
    rows = [[code(p.get("reader")), p.get("reader_tenant") or Html('<span class="muted">unknown</span>'),
             code(p.get("source") if p.get("source") is not None else f"unknown (slot {p.get('source_slot')})"),
             p.get("source_tenant") or Html('<span class="muted">unknown</span>'),
             ranges_cell(facts.pool_ranges(p.get("pages") or [], CELL_RANGES)),
             time_cell(p.get("first")), time_cell(p.get("last")), p.get("reads")] for p in full]
    readers = {p.get("reader") for p in full}
    head = (f"<p>{len(full):,} request pair(s): {len(readers):,} response(s) received data of other requests, "
            f"in {len(groups):,} tenant pair(s).</p>") if full else ""
    body = (note + head
            + ("<h3>By tenant</h3>" + table(["Who received whose data", "Request pairs", "Reads", "Pages", "First",
                                              "Last"], group_rows, numeric=(1, 2, 3), what="tenant pairs")
               if groups else "")
            + ("<h3>By request</h3>" if full else "")
            + table(["Reader", "Reader tenant", "Source", "Source tenant", "Pages", "First", "Last", "Reads"],
                    rows, empty, numeric=(7,), what="pairs"))
    return section("Affected pairs (reader received data written by source)", body, anchor="pairs")


# ---- alerts -------------------------------------------------------------------------------


def _named_cell(named: facts.Named, text_of, shown: int, unit: str) -> Html:
    """A cell of what an alert named: the first `shown`, then how many more and why."""
    listed = list(named.listed)
    cut = max(0, len(listed) - shown)
    left = cut + named.not_kept
    if named.not_kept:
        why = f"the engine keeps the newest {len(listed):,} of {named.known_total:,}"
    elif named.uncounted:
        why = f"at least: the engine keeps the newest {facts.ENGINE_LIST_CAP} and did not count the rest"
    else:
        why = "in state.json" if cut else ""
    if not listed and not left:
        return Html('<span class="muted">none</span>')
    extra = more(left, f"more {unit}", why)
    if named.uncounted and not left:
        extra = Html(f' <span class="more">({esc(why)})</span>')
    return Html(text_of(listed[:shown]) + extra)


def alerts(state: dict) -> str:
    episodes = facts.episodes(state.get("alerts") or [])
    later = {e.key for e in facts.outcome(state).stopped_later}
    rows = []
    for e in episodes:
        a = e.record
        episode = Html(f'<span class="nw">{e.number} of {e.of}</span>'
                       + (f" {badge('previous run', 'previous')}" if e.previous_run else ""))
        prevented = {True: badge("yes", "prevented"), False: badge("no", "leaked")}.get(e.prevented, "")
        if e.key in later:  # its own defence was off; a later one stopped every request it names
            prevented = Html(f"{badge('no', 'leaked')} {badge('stopped later', 'prevented')}")
        requests = _named_cell(e.requests, lambda ids: ", ".join(str(code(i)) for i in ids), CELL_NAMES, "requests")
        pages = _named_cell(e.pages, lambda ps: esc(facts.plain_ranges(ps, len(ps)).text), facts.ENGINE_LIST_CAP,
                            "pages")
        alert = Html(f"<b>{esc(a.get('kind'))}</b> {code(a.get('subject'))}"
                     f'<div class="detail">{esc(a.get("detail"))}</div>')
        seen = Html(f"{time_cell(a.get('first_seen'))}<br>{time_cell(a.get('last_seen'))}")
        rows.append([alert, episode, Html(f"{badge(a.get('severity'))} {badge(a.get('state'))}"), prevented, seen,
                     a.get("count"), badge(bool(a.get("acked"))), requests, pages])
    ids = {e.id for e in episodes}
    previous = sum(e.previous_run for e in episodes)
    head = (f"<p>{len(episodes):,} episode(s) of {len(ids):,} alert(s)"
            + (f", {previous:,} from an earlier engine run" if previous else "")
            + ". An alert that resolves and fires again starts a new episode; each is listed.</p>") if episodes else ""
    return section("Alerts (every episode)", head + table(
        ["Alert and its detail", "Episode", "Severity, state", "Prevented", "First / last seen", "Count", "Acked",
         "Requests", "Pages"], rows, "No alerts.", numeric=(5,), what="alert episodes"), anchor="alerts")
