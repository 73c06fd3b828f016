"""Read a report.html back as a reviewer sees it: per section (its h2), the plain text and the
tables, each under its nearest heading, as rows of cell text."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from html.parser import HTMLParser


@dataclass
class Table:
    heading: str
    headers: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)

    def column(self, name: str) -> list[str]:
        i = self.headers.index(name)
        return [row[i] for row in self.rows]

    def records(self) -> list[dict[str, str]]:
        return [dict(zip(self.headers, row)) for row in self.rows]


@dataclass
class Section:
    title: str
    text: str = ""
    tables: list[Table] = field(default_factory=list)

    def table(self, heading_start: str) -> Table:
        found = [t for t in self.tables if t.heading.startswith(heading_start)]
        assert found, f"no table under a heading starting {heading_start!r} in {self.title!r}: " \
                      f"{[t.heading for t in self.tables]}"
        return found[0]


def squash(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


BLOCKS = {"p", "li", "ul", "ol", "td", "th", "tr", "div", "br", "section", "figure", "figcaption", "table", "h3"}


class _Reader(HTMLParser):
    def __init__(self):
        super().__init__()
        self.sections: list[Section] = []
        self.heading: str | None = None  # text of the h2/h3 being read
        self.last_heading = ""
        self.table: Table | None = None
        self.cell: list[str] | None = None
        self.row: list[str] | None = None
        self.in_head = False
        self.last_tag = ""

    def _space(self, tag):
        if tag in BLOCKS and self.sections:
            self.sections[-1].text += " "

    def handle_starttag(self, tag, attrs):
        self._space(tag)
        if tag in ("h2", "h3"):
            self.heading = ""
            self.last_tag = tag
        elif tag == "table":
            self.table = Table(self.last_heading)
        elif tag == "tr":
            self.row = []
        elif tag in ("td", "th"):
            self.cell = []
            self.in_head = tag == "th"
        elif tag == "br" and self.cell is not None:
            self.cell.append(" ")

    def handle_endtag(self, tag):
        self._space(tag)
        if tag in ("h2", "h3") and self.heading is not None:
            text = squash(self.heading)
            if tag == "h2":
                self.sections.append(Section(text))
            self.last_heading = text
            self.heading = None
        elif tag in ("td", "th") and self.cell is not None and self.row is not None:
            self.row.append(squash("".join(self.cell)))
            self.cell = None
        elif tag == "tr" and self.row is not None and self.table is not None:
            if self.in_head and not self.table.headers:
                self.table.headers = self.row
            else:
                self.table.rows.append(self.row)
            self.row = None
        elif tag == "table" and self.table is not None:
            if self.sections:
                self.sections[-1].tables.append(self.table)
            self.table = None

    def handle_data(self, data):
        if self.heading is not None:
            self.heading += data
        if self.cell is not None:
            self.cell.append(data)
        if self.sections and not (self.heading is not None and self.last_tag == "h2"):
            self.sections[-1].text += data


def read_report(html: str) -> dict[str, Section]:
    """{section title: Section}; titles are the h2 texts."""
    reader = _Reader()
    reader.feed(html)
    for section in reader.sections:
        section.text = squash(section.text)
    return {s.title: s for s in reader.sections}


def section(html: str, title_start: str) -> Section:
    sections = read_report(html)
    found = [s for t, s in sections.items() if t.startswith(title_start)]
    assert found, f"no section starting {title_start!r}: {list(sections)}"
    return found[0]
