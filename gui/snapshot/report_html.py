"""The HTML pieces every section of `report.html` is built from: the style sheet, escaping,
times, badges, tables that say how many rows they left out, and sections.

Every string from the engine or the network goes through `esc` (html.escape); `Html` marks
a string that is already HTML built here from escaped parts. Pure Python (no Qt).
"""

from __future__ import annotations

from datetime import datetime, timezone
from html import escape

MAX_ROWS = 500  # per table; the JSON files hold everything

CSS = """
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 -apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;
 color:#1d1d1f;background:#f4f5f7}
header{background:#1f2226;color:#e6e6e6;padding:22px 32px 18px}
header h1{margin:0 0 6px;font-size:22px;font-weight:600;color:#fff}
header .meta{display:flex;flex-wrap:wrap;gap:4px 28px;font-size:13px;color:#b8bcc2}
header .meta b{color:#e6e6e6;font-weight:600}
main{padding:8px 32px 40px;max-width:1400px}
section{background:#fff;border:1px solid #dfe2e6;border-radius:6px;padding:14px 18px;margin:16px 0;overflow-x:auto}
h2{font-size:16px;margin:0 0 10px;color:#2b2f36}
h3{font-size:14px;margin:14px 0 6px;color:#2b2f36}
.nw{white-space:nowrap}
.headline{font-size:20px;font-weight:600;margin:0}
.headline.bad{color:#b3261e}.headline.ok{color:#23803f}
.privacy{border-left:4px solid #3d7bd9;background:#eef4fd}
.outcome-bad{border-left:4px solid #b3261e}
.outcome-ok{border-left:4px solid #23803f}
.outcome-none{border-left:4px solid #7a7a80}
.runbook ol{margin:6px 0 0;padding-left:22px}
.runbook li{margin:4px 0}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{text-align:left;padding:5px 8px;border-bottom:1px solid #e6e8eb;vertical-align:top}
th{background:#eceef1;font-weight:600;color:#3a3f47;white-space:nowrap}
th.num{text-align:right}
tbody tr:nth-child(even){background:#f7f8fa}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.mono,code{font-family:"SFMono-Regular",Menlo,Consolas,monospace;font-size:12px;overflow-wrap:break-word}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;font-weight:600;color:#fff}
.b-critical,.b-failed,.b-firing,.b-yes,.b-placeholder,.b-leaked{background:#b3261e}
.b-warning,.b-pending,.b-rejected{background:#c26a00}
.b-info,.b-previous{background:#1d5fbf}
.b-resolved,.b-finished,.b-no,.b-acknowledged,.b-prevented{background:#23803f}
.b-other{background:#7a7a80}
.muted{color:#7a7a80}
.detail{color:#4a4f57;font-size:12px;margin-top:2px;min-width:20em;max-width:46em}
.more{color:#5a5f66;font-style:italic}
.warn{color:#b3261e;font-weight:600}
.grid{display:flex;flex-wrap:wrap;gap:16px}
.grid>div{flex:1 1 300px;min-width:0}
.maps{display:grid;grid-template-columns:1fr 1fr;gap:16px;margin:0 0 14px}
.maps>figure{min-width:0}
.maps .absent{border:1px dashed #c9ccd1;border-radius:4px;padding:12px;color:#5a5f66;font-size:13px}
figure{margin:0 0 12px}
figure img{max-width:100%;image-rendering:pixelated;border:1px solid #dfe2e6}
figcaption{font-size:12px;color:#5a5f66}
pre{background:#f7f8fa;border:1px solid #e6e8eb;padding:10px;margin:0;overflow:auto;font-size:12px}
.lanes{font-size:12px;margin:8px 0 16px}
.lane{display:flex;align-items:center;height:22px}
.lane .badge{flex:0 0 92px;text-align:center;font-size:11px;padding:0 4px;margin-right:8px}
.lane .id{flex:0 0 200px;overflow:hidden;text-overflow:ellipsis;white-space:nowrap;padding-right:8px}
.lane .track{position:relative;flex:1;height:12px;background:#f0f1f3}
.lane .span{position:absolute;top:0;height:12px;min-width:2px}
.legend span{display:inline-block;margin-right:14px}
.legend i{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:-1px}
"""


class Html(str):
    """A string that is already HTML (built here from escaped parts)."""


def esc(value) -> str:
    """`value` as escaped HTML text: numbers with thousands separators, booleans as yes / no,
    lists joined with commas, None as nothing; an Html string as it is."""
    if isinstance(value, Html):
        return value
    if value is None:
        return ""
    if isinstance(value, float):
        value = f"{value:,.3f}".rstrip("0").rstrip(".")
    elif isinstance(value, bool):
        value = "yes" if value else "no"
    elif isinstance(value, int):
        value = f"{value:,}"
    elif isinstance(value, (list, tuple)):
        value = ", ".join(str(v) for v in value)
    return escape(str(value))


def utc(t) -> str:
    """Unix seconds as UTC ISO 8601 with milliseconds, e.g. 2026-12-02T19:30:00.123Z."""
    if not isinstance(t, (int, float)) or isinstance(t, bool):
        return ""
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def time_cell(t) -> Html:
    """A UTC time that does not wrap in a table cell."""
    return Html(f'<span class="nw">{esc(utc(t))}</span>')


KNOWN_BADGES = ("critical", "warning", "info", "failed", "firing", "pending", "rejected", "resolved", "finished",
                "acknowledged", "yes", "no", "placeholder", "prevented", "leaked")


def badge(text, kind: str | None = None) -> Html:
    """A coloured pill; its colour from `kind`, or from the text itself when it is a known state."""
    text = esc(text)
    kind = kind or (text if text in KNOWN_BADGES else "other")
    return Html(f'<span class="badge b-{kind}">{text}</span>')


def code(value) -> Html:
    return Html(f'<span class="mono">{esc(value)}</span>')


def more(count: int, what: str = "more", why: str = "") -> Html:
    """"+N more" (and why, in brackets) where a list was cut; nothing when count is 0."""
    if count <= 0:
        return Html("")
    return Html(f' <span class="more">+{count:,} {esc(what)}{f" ({esc(why)})" if why else ""}</span>')


def table(headers: list[str], rows: list[list], empty: str = "None.", numeric: tuple[int, ...] = (),
          what: str = "rows") -> str:
    """A table of at most MAX_ROWS rows; past that it says how many `what` it left out."""
    if not rows:
        return f'<p class="muted">{esc(empty)}</p>'
    head = "".join(f'<th class="num">{esc(h)}</th>' if i in numeric else f"<th>{esc(h)}</th>"
                   for i, h in enumerate(headers))
    body = []
    for row in rows[:MAX_ROWS]:
        cells = "".join(f'<td class="num">{esc(c)}</td>' if i in numeric else f"<td>{esc(c)}</td>"
                        for i, c in enumerate(row))
        body.append(f"<tr>{cells}</tr>")
    left = len(rows) - MAX_ROWS
    note = (f'<p class="more">{left:,} more {esc(what)} not shown here (of {len(rows):,}); the JSON files hold '
            f"them all.</p>") if left > 0 else ""
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>{note}"


def section(title: str, body: str, cls: str = "", anchor: str = "") -> str:
    ident = f' id="{esc(anchor)}"' if anchor else ""
    return f'<section class="{cls}"{ident}><h2>{esc(title)}</h2>{body}</section>'
