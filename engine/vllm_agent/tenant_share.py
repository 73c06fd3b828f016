"""cross_tenant_share: vLLM prefix-cache blocks that reach requests of another tenant.

vLLM 0.32 shares a full block between requests whose tokens, and whose block-hash extra keys,
are equal. A request's `cache_salt` is one of those keys (mixed into its first block's hash,
and through the hash chain into every later one), so requests of different salts never share a
block. Two findings, both of kind `cross_tenant_share`:

- shared (warning): requests of one salt (usually none) but of different tenants, as the
  operator maps them (`tenant_field`: a key of the request's `vllm_xargs`), reach the same
  block. A configuration finding: the prefix cache is shared across tenants, and each tenant's
  cache hits (time to first token) tell it what the other sent. Give each tenant a salt.
- crossed (critical): requests of different salts reach the same block. vLLM cannot do this
  while it hashes the salt, so one tenant read KV another tenant's request computed.

"Reach" counts the request that first held the block (its writer) as well as the live holders:
a later request hitting a block that the other tenant's finished request left in the cache is
the same side channel as two requests holding it at once, and the common case (requests of a
chat rarely overlap). The writer is remembered per block id while the block keeps its hash, so
the memory is bounded by the pool. A block evicted and refilled with the same content between
two snapshots, without a hit, would be attributed to its old writer; that needs unsalted
requests of different tenants, itself the first finding.

Salts are secrets: alerts name a salt only by `salt_tag` (the first 8 hex digits of its
SHA-256).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from engine.vllm_agent.checks import MAX_FINDINGS, MAX_NAMED, Finding
from engine.vllm_agent.snapshot import PoolSnapshot

KIND = "cross_tenant_share"  # different salts on one block: data crossed tenants
SHARED_KIND = "prefix_cache_shared"  # one salt (or none) across tenants: a finding of configuration
SALT_TAG_HEX = 8
MAX_RANGES = 8  # block ranges spelled in a subject; past it the subject ends with a digest


def salt_tag(salt: str | None) -> str | None:
    """How an alert names a cache_salt: the first 8 hex digits of its SHA-256, never the salt.
    None for no salt (vLLM hashes no salt for None or "")."""
    return hashlib.sha256(salt.encode()).hexdigest()[:SALT_TAG_HEX] if salt else None


@dataclass(frozen=True)
class Party:
    """A request that reached a block: one of its live holders, or the request that filled it."""
    request_id: str
    salt_tag: str | None
    tenant: str | None


class TenantShareCheck:
    """Stateful (it remembers who filled each cached block): one per agent, fed every snapshot."""

    def __init__(self) -> None:
        self._writer: dict[int, tuple[bytes, Party]] = {}  # block id -> (its hash, who first held it)
        self._most_at_once: dict[str, int] = {}  # subject -> most live holders seen, while it stays in view

    def check(self, snap: PoolSnapshot) -> list[Finding]:
        holders: dict[int, list[Party]] = {}
        for rid, req in snap.requests.items():
            party = Party(rid, req.salt_tag, req.tenant)
            for block_id in req.block_ids:
                holders.setdefault(block_id, []).append(party)
        groups: dict[tuple[str, frozenset], tuple[list[int], dict[str, Party]]] = {}
        for block_id, parties in holders.items():
            view = snap.blocks.get(block_id)
            block_hash = view.block_hash if view is not None else None
            if block_hash is None:  # partial or new: not in the prefix cache (checks.py flags sharing it)
                self._writer.pop(block_id, None)
                continue
            known = self._writer.get(block_id)
            if known is None or known[0] != block_hash:
                known = self._writer[block_id] = (block_hash, parties[0])
            reached = {p.request_id: p for p in (known[1], *parties)}
            what = _classify(reached.values())
            if what is None:
                continue
            key = (what, frozenset((p.salt_tag, p.tenant) for p in reached.values()))
            blocks, named = groups.setdefault(key, ([], {}))
            blocks.append(block_id)
            named.update(reached)
        findings, most = [], {}
        for (what, _), (blocks, named) in groups.items():
            blocks.sort()
            subject = _subject(what, blocks)
            live = max(len(holders[b]) for b in blocks)  # live requests holding one block at once
            most[subject] = max(live, self._most_at_once.get(subject, 0))
            findings.append(_finding(what, subject, blocks, list(named.values()), most[subject]))
        self._most_at_once = most
        return findings[:MAX_FINDINGS]


def _classify(parties) -> str | None:
    parties = list(parties)
    if len({p.salt_tag for p in parties}) > 1:
        return "crossed"
    if len({p.tenant for p in parties if p.tenant is not None}) > 1:
        return "shared"
    return None


def _finding(what: str, subject: str, blocks: list[int], parties: list[Party], at_once: int) -> Finding:
    where = _ranges(blocks)
    names = ", ".join(_name(p, what) for p in parties[:6])
    names += f" and {len(parties) - 6} more" if len(parties) > 6 else ""
    count = f"{len(blocks)} vLLM block(s) [{where}]"
    how = (f"up to {at_once} holding them at once" if at_once > 1
           else "each later one hit what an earlier, finished one left in the cache")
    if what == "crossed":
        detail = (f"data crossed tenants: {count} reached by requests of different cache_salts: {names} "
                  f"({how}). vLLM mixes the salt into the first block's hash, so salted requests of "
                  "different salts never share a block: the salt was left out of the block hash")
        severity = "critical"
    else:
        tenants = sorted({p.tenant for p in parties if p.tenant is not None})
        salt = parties[0].salt_tag
        under = "with no cache_salt" if salt is None else f"under one cache_salt (sha256 {salt})"
        detail = (f"prefix cache shared across tenants {', '.join(tenants)}: {count} reached by requests {under}: "
                  f"{names} ({how}). Each tenant's cache hits (time to first token) reveal the other's "
                  "prompts: give each tenant its own cache_salt")
        severity = "warning"
    return Finding(KIND if what == "crossed" else SHARED_KIND, subject, detail, tuple(p.request_id for p in parties[:MAX_NAMED]),
                   tuple(blocks), severity=severity)


def _name(party: Party, what: str) -> str:
    """A request as a finding names it: its tenant, and for a crossing its salt's tag."""
    said = [f"tenant {party.tenant}"] if party.tenant is not None else []
    if what == "crossed":
        said.append("no salt" if party.salt_tag is None else f"salt sha256 {party.salt_tag}")
    return f"{party.request_id} ({', '.join(said)})" if said else party.request_id


def _ranges(blocks: list[int]) -> str:
    """Sorted block ids as ranges: [3, 4, 5, 9] -> "3-5,9"."""
    out: list[str] = []
    start = prev = blocks[0]
    for b in [*blocks[1:], None]:
        if b is not None and b == prev + 1:
            prev = b
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if b is not None:
            start = prev = b
    return ",".join(out)


def _subject(what: str, blocks: list[int]) -> str:
    """One alert episode per block set (the AlertBook aggregates on kind and subject), not one
    per snapshot; a long set of ranges ends in a digest of the ids so the subject stays short."""
    where = _ranges(blocks)
    if where.count(",") >= MAX_RANGES:
        digest = hashlib.sha256(where.encode()).hexdigest()[:8]
        where = ",".join(where.split(",")[:MAX_RANGES]) + f",…#{digest}"
    return f"{what}:blocks:{where}"
