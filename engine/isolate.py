"""Run a batched forward pass so that one request cannot fail the others.

A forward pass over a batch raises for the whole batch, even when one request's input is
what made it raise. `each_alone` runs the batch; if it raises, it runs every request of the
batch by itself, so the requests that run alone are served and the ones that still raise
are handed to `fail`, each with a RequestFailed naming it. Re-running is safe: a forward
pass only writes the K/V of its own requests' token slots, and writes the same values
again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from engine.errors import RequestFailed
from engine.request import Request

R = TypeVar("R")


def each_alone(forward: Callable[[list[Request]], R], requests: Sequence[Request],
               fail: Callable[[Request, RequestFailed], None], what: str) -> list[tuple[list[Request], R]]:
    """[(requests, forward(requests))] for the whole batch, or, when that raises, for each
    request that runs alone; the others go to `fail`. `what` names the pass in errors."""
    requests = list(requests)
    if not requests:
        return []
    try:
        return [(requests, forward(requests))]
    except Exception as batch_exc:  # noqa: BLE001 - anything a request's input can cause
        if len(requests) == 1:
            fail(requests[0], _error(requests[0], what, batch_exc))
            return []
    groups = []
    for request in requests:
        try:
            groups.append(([request], forward([request])))
        except Exception as exc:  # noqa: BLE001
            fail(request, _error(request, what, exc))
    return groups


def _error(request: Request, what: str, exc: Exception) -> RequestFailed:
    first_line = (str(exc).splitlines() or [""])[0][:300]
    return RequestFailed(f"request {request.request_id}: its {what} raised {type(exc).__name__}: {first_line}; "
                         f"it failed alone, the rest of its batch was served")
