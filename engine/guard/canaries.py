"""CanaryBook: canary requests the supervisor sends on a schedule, each carrying a unique
random marker, and the two detectors that watch them.

White-box: a request other than the canary touching a page the canary wrote (an I1
detection or a real cross read whose source is a canary) is a `canary_leak`.
Black-box: the marker's token sequence in any non-canary output is a
`canary_marker_in_output`.
"""

from __future__ import annotations

import secrets
import string
import time
from collections import OrderedDict
from dataclasses import dataclass

from engine.wire.prompt_form import PROMPT_FORM
from engine.wire.protocol import CANARY_TENANT

TENANT = CANARY_TENANT
ALPHABET = string.ascii_lowercase + string.digits
KEEP = 256  # canaries remembered for the detectors
MAX_LIVE = 2  # scheduled canaries wait while this many are still running: probes, not load
LIVE_TIMEOUT_S = 600.0  # a canary running this long no longer holds the schedule back


@dataclass
class Canary:
    request_id: str
    slot: int
    marker: str
    marker_ids: list[int]
    sent: float


class CanaryBook:
    def __init__(self, per_minute: int, marker_chars: int, enabled: bool = True):
        self.per_minute, self.marker_chars, self.enabled = per_minute, marker_chars, enabled
        self.by_slot: OrderedDict[int, Canary] = OrderedDict()
        self.by_request: dict[str, Canary] = {}
        self.live: set[str] = set()  # canaries not finished yet
        self.skipped = 0  # scheduled canaries not sent because MAX_LIVE were still running
        self.off_reason: str | None = None if enabled else "canaries.enabled = false"
        self._last = time.monotonic()

    def configure(self, section) -> None:
        self.enabled, self.per_minute, self.marker_chars = section.enabled, section.per_minute, section.marker_chars
        self.off_reason = None if self.enabled else "canaries.enabled = false"

    def disable(self, reason: str) -> None:
        """Canaries cannot run (e.g. the model has no tokenizer): off, and status says why."""
        self.enabled, self.off_reason = False, reason

    def describe(self) -> dict:
        return {"enabled": self.enabled, "off_reason": self.off_reason, "per_minute": self.per_minute,
                "live": len(self.live), "skipped": self.skipped}

    def due(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        if not self.enabled or self.per_minute <= 0 or now - self._last < 60.0 / self.per_minute:
            return False
        self._last = now
        if len(self.live) >= MAX_LIVE:
            wall = time.time()
            self.live = {r for r in self.live if r in self.by_request
                         and wall - self.by_request[r].sent < LIVE_TIMEOUT_S}
        if len(self.live) >= MAX_LIVE:  # a saturated engine is not flooded with probes
            self.skipped += 1
            return False
        return True

    def finished(self, request_id: str) -> None:
        self.live.discard(request_id)

    def new_marker(self) -> str:
        return "".join(secrets.choice(ALPHABET) for _ in range(self.marker_chars))

    def prompt(self, marker: str) -> str:
        return PROMPT_FORM.format(text=marker)

    def add(self, request_id: str, slot: int, marker: str, marker_ids: list[int]) -> Canary:
        canary = Canary(request_id, slot, marker, marker_ids, time.time())
        self.by_slot[slot] = canary
        self.by_request[request_id] = canary
        self.live.add(request_id)
        while len(self.by_slot) > KEEP:
            _, old = self.by_slot.popitem(last=False)
            self.by_request.pop(old.request_id, None)
        return canary

    def is_canary_slot(self, slot: object) -> bool:
        return slot in self.by_slot

    def markers_in(self, output_ids: list[int], exclude_slot: int | None = None) -> list[Canary]:
        """Canaries whose marker token sequence appears in `output_ids` (black-box)."""
        found = []
        for canary in self.by_slot.values():
            ids = canary.marker_ids
            if canary.slot == exclude_slot or not ids or len(ids) > len(output_ids):
                continue
            first = ids[0]
            for i in range(len(output_ids) - len(ids) + 1):
                if output_ids[i] == first and output_ids[i:i + len(ids)] == ids:
                    found.append(canary)
                    break
        return found
