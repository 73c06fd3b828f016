"""Conditions GUI tests wait for, written once. qtbot.waitUntil needs a callback that
returns exactly True, False or None (pytest-qt raises on anything else, e.g. an empty
list), so every predicate here returns a bool."""

from __future__ import annotations


def connected_and_ready(window) -> bool:
    """The window is connected and has seen every worker ready (and at least one)."""
    workers = window.state.workers
    return (window.source.now.connected and bool(workers)
            and all(w.state == "ready" for w in workers))
