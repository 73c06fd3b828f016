"""Source: what the window shows and how it is linked to it (Qt-free).

One value, replaced on every change (gui/source.py owns it and what it holds open): the
kind of source, its label, and its link state, kept apart from the kind. The window's
title, status line, enabled actions, read-only rules and which menus apply are functions
of it and of the user's --readonly choice, recomputed on every change, never toggled by
hand in several places.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from engine.wire.roles import READ_ONLY_OPS
from gui.model.window_title import engine_label, window_title


class Kind(StrEnum):
    NONE = "none"  # nothing yet (a hosted engine starting), or the source was closed
    LIVE = "live"  # a PageWarden engine over ZeroMQ, attached or hosted
    VLLM_AGENT = "vllm_agent"  # a live link whose engine answers viewer ops only (its status says read_only)
    SNAPSHOT = "snapshot"  # an incident bundle, read from a file
    KV_EVENTS = "kv_events"  # vLLM / SGLang KV-event streams, watched only


class Link(StrEnum):
    CONNECTING = "connecting"
    CONNECTED = "connected"
    LOST = "lost"  # the engine stopped answering; the transport keeps trying
    CLOSED = "closed"
    READ_ONLY = "read-only"  # a file or a one-way stream: nobody to send a command to


LIVE_KINDS = (Kind.LIVE, Kind.VLLM_AGENT)
LINK_WORDS = {Link.CONNECTING: "connecting", Link.CONNECTED: "connected", Link.LOST: "reconnecting",
              Link.CLOSED: "disconnected", Link.READ_ONLY: "read-only"}
KV_TITLE = "PageWarden — vLLM / SGLang KV events (watch only)"


@dataclass(frozen=True)
class Source:
    kind: Kind = Kind.NONE
    label: str = ""  # live: the control endpoint; snapshot: the file's name; KV events: the endpoints
    link: Link = Link.CLOSED
    hosted: bool = False  # a live engine this app started
    taken: str | None = None  # a snapshot: when it was taken (its manifest's created_utc)
    note: str = ""  # said instead of the link's own word until the link changes ("hosted engine starting")
    behind: Source | None = None  # a snapshot: the live engine still listened to behind it

    # ---- what it is -------------------------------------------------------------------
    @property
    def live(self) -> bool:
        return self.kind in LIVE_KINDS

    @property
    def connected(self) -> bool:
        """A live engine shown now, answering."""
        return self.live and self.link is Link.CONNECTED

    @property
    def listened(self) -> Source | None:
        """The live link telemetry and answers come from: this source, the one behind a snapshot, or None."""
        return self if self.live else self.behind

    # ---- changes (each a new value) -----------------------------------------------------
    def with_link(self, link: Link) -> Source:
        """The listened link's new state (behind a snapshot: the engine's behind it)."""
        if not self.live and self.behind is not None:
            return replace(self, behind=self.behind.with_link(link))
        return replace(self, link=link, note="")

    def with_engine_read_only(self, read_only: bool) -> Source:
        """The listened engine's status said whether it answers viewer ops only."""
        if not self.live:
            return self if self.behind is None else replace(self, behind=self.behind.with_engine_read_only(read_only))
        return replace(self, kind=Kind.VLLM_AGENT if read_only else Kind.LIVE)

    def with_note(self, note: str) -> Source:
        return replace(self, note=note)

    # ---- the rules the window follows ---------------------------------------------------
    def allows(self, op: str, *, user_readonly: bool) -> bool:
        """Whether the window may send `op`: a viewer op wherever an engine is listened to
        (behind a snapshot too); any other only to a live PageWarden engine the user did
        not make read-only."""
        if self.listened is None:
            return False
        return op in READ_ONLY_OPS or (self.kind is Kind.LIVE and not user_readonly)

    def read_only(self, user_readonly: bool) -> bool:
        """What the window does: read-only when the user chose it or the engine shown is."""
        return user_readonly or self.kind is Kind.VLLM_AGENT

    def views_read_only(self, user_readonly: bool) -> bool:
        """The views' own buttons (acknowledge, worker commands, reconfigure): off over a snapshot too."""
        return self.read_only(user_readonly) or self.kind is Kind.SNAPSHOT

    def controls_enabled(self, user_readonly: bool) -> bool:
        """The control actions (demo, reconfigure, worker commands, acknowledge, canary)."""
        return self.connected and not self.read_only(user_readonly)

    def export_enabled(self, exporting: bool) -> bool:
        return self.connected and not exporting

    def demo_allowed(self, user_readonly: bool) -> bool:
        """Demo load may run (it waits for the engine to answer before it sends)."""
        return self.kind is not Kind.KV_EVENTS and not self.read_only(user_readonly)

    @property
    def shows_engine_views(self) -> bool:
        """The engine's maps, docks, menu, colour modes and status line apply (not to KV events)."""
        return self.kind is not Kind.KV_EVENTS

    def read_only_reason(self) -> str:
        return "the engine answers viewer requests only" if self.kind is Kind.VLLM_AGENT \
            else "read-only window (--readonly)"

    # ---- the words the window shows ------------------------------------------------------
    def address(self) -> str:
        """The status line's address: the engine's endpoint, or the snapshot's file ("" for none)."""
        if self.live:
            return f"hosted engine {self.label}" if self.hosted and self.label else self.label
        return f"snapshot {self.label}" if self.kind is Kind.SNAPSHOT else ""

    def link_words(self) -> str:
        """The status line's connection: "connected", "reconnecting", "read-only snapshot", …"""
        if self.note:
            return self.note
        return "read-only snapshot" if self.kind is Kind.SNAPSHOT else LINK_WORDS[self.link]

    def title(self, *, user_readonly: bool, engine_name=None, hostname=None, critical: int = 0) -> str:
        """The window's title: the source, whether it is read-only, and the critical alerts
        firing on a live engine (engine_name, hostname: what its status said)."""
        if self.kind is Kind.KV_EVENTS:
            return KV_TITLE
        if self.kind is Kind.SNAPSHOT:
            return f"PageWarden — snapshot {self.label} (read-only)"
        readonly = ""
        if self.kind is Kind.VLLM_AGENT:
            readonly = "read-only engine" + (f": {engine_name}" if isinstance(engine_name, str) and engine_name else "")
        elif user_readonly:
            readonly = "read-only"
        engine = engine_label(self.label, self.hosted, hostname) if self.live else ""
        return window_title(engine, critical=critical if self.live else 0, readonly=readonly)
