"""What to watch of a vLLM / SGLang KV-event stream, as a user typed it (the GUI's attach
dialog and `main.py watch-kv-events`): endpoints, replay endpoints and the dialect, checked."""

from __future__ import annotations

from dataclasses import dataclass

from engine.adapters.kv_event_decode import KvEventError, check_dialect
from engine.adapters.kv_event_state import KvEventState
from engine.adapters.kv_event_watch import KvEventWatcher, check_address

NO_REPLAY = ("-", "none")  # a replay placeholder for an endpoint that has no replay endpoint


@dataclass(frozen=True)
class KvAttach:
    """What to watch: endpoints, each one's replay endpoint (or None), and the dialect."""

    endpoints: tuple[str, ...]
    replay: tuple[str | None, ...]
    dialect: str

    def watcher(self, state: KvEventState | None = None) -> KvEventWatcher:
        """A watcher connected to every endpoint (raises KvEventError as the constructor does)."""
        return KvEventWatcher(list(self.endpoints), list(self.replay), self.dialect, state)


def check_kv_attach(endpoints, replay=(), dialect: str | None = "auto") -> KvAttach:
    """Endpoints and replay endpoints as typed (strings; '-' or 'none' for an endpoint without
    replay) -> KvAttach. Raises KvEventError naming the bad value and what was expected."""
    endpoints = [str(e).strip() for e in endpoints if str(e).strip()]
    replay = [str(r).strip() for r in replay if str(r).strip()]
    if not endpoints:
        raise KvEventError("no endpoint to watch; give at least one tcp://HOST:PORT or ipc://PATH")
    for endpoint in endpoints:
        check_address(endpoint)
    twice = sorted({e for e in endpoints if endpoints.count(e) > 1})
    if twice:
        raise KvEventError(f"endpoint {twice[0]} is named twice")
    if len(replay) > len(endpoints):
        raise KvEventError(f"{len(replay)} replay addresses for {len(endpoints)} endpoints; give at most one per "
                           "endpoint, in the same order ('-' for none)")
    replay = [None if r.lower() in NO_REPLAY else check_address(r) for r in replay]
    replay += [None] * (len(endpoints) - len(replay))
    return KvAttach(tuple(endpoints), tuple(replay), check_dialect(dialect or "auto"))
