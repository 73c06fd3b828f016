"""Find: one query across the page maps and the tables: a request or a tenant (Qt-free).

`acme` matches requests whose id or tenant contains it (any case); `tenant:acme` and
`request:r12` match the tenant or the id exactly. The window holds one Find in its state;
the requests and alerts tables show only what matches, and the page maps dim every page
whose owner does not match.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PREFIXES = ("tenant:", "request:")


@dataclass(frozen=True)
class Find:
    text: str = ""

    @property
    def active(self) -> bool:
        return bool(self.text.strip())

    def _parts(self) -> tuple[str | None, str]:
        text = self.text.strip()
        for prefix in PREFIXES:
            if text.lower().startswith(prefix):
                return prefix[:-1], text[len(prefix):].strip()
        return None, text.lower()

    def matches(self, request_id: str | None, tenant: str | None) -> bool:
        """Does a request (its id and tenant) match? Everything matches an empty query."""
        if not self.active:
            return True
        field, value = self._parts()
        if field == "tenant":
            return (tenant or "") == value
        if field == "request":
            return (request_id or "") == value
        return value in (request_id or "").lower() or value in (tenant or "").lower()

    def matching_slots(self, rows) -> np.ndarray:
        """The slots (int64, sorted) of the request rows (RequestRow-like: request_id,
        tenant, slot) that match."""
        return np.unique(np.array([r.slot for r in rows if r.slot >= 0 and self.matches(r.request_id, r.tenant)],
                                  dtype=np.int64))

    def describe(self) -> str:
        field, value = self._parts()
        return f"{field} {value!r}" if field else f"requests or tenants containing {value!r}"
