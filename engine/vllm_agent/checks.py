"""The isolation checks on vLLM's own state, on one PoolSnapshot.

vLLM shares a block between requests only through its prefix cache: a full block whose
content hash equals the hash of each holder's own tokens at that position. So:

- a block in a request's table whose content hash is not the hash of that request's own
  tokens there holds another request's data: `ownership_violation`;
- a block held by two or more live requests that is not a full hashed block is one
  request's private (partial) block handed to another: `ownership_violation`;
- a block held by more live requests than the pool counts (ref_cnt) can be handed to a new
  request while they still read it: `ownership_violation`;
- a request's block table must cover exactly the tokens it has computed plus the ones
  scheduled this step (ceil(tokens / block size) blocks): `block_table_mismatch`. One
  exception, vLLM's own: after a KV load failed, vLLM moves the request's computed tokens back
  to the first failed block and recomputes, keeping the blocks it holds, so a request the
  connector saw rewound may hold more blocks than its tokens need (never fewer) until then.

The window-versus-capacity check (`capacity_exceeds_window`) needs no snapshot:
`capacity_finding()`.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.vllm_agent.snapshot import PoolSnapshot

MAX_FINDINGS = 64  # per snapshot: a broken pool says so without flooding the alert book
MAX_NAMED = 16  # requests named per finding


@dataclass(frozen=True)
class Finding:
    kind: str  # an alert kind (engine/wire/alert_kinds.py)
    subject: str  # what the alert aggregates on (one alert per block or request)
    detail: str
    requests: tuple[str, ...]
    pages: tuple[int, ...]
    severity: str = "critical"


def check_snapshot(snap: PoolSnapshot) -> list[Finding]:
    holders: dict[int, list[tuple[str, int]]] = {}
    for rid, req in snap.requests.items():
        for position, block_id in enumerate(req.block_ids):
            holders.setdefault(block_id, []).append((rid, position))
    findings: list[Finding] = []
    for block_id, held_by in holders.items():
        findings += _check_block(snap, block_id, held_by)
        if len(findings) >= MAX_FINDINGS:
            return findings[:MAX_FINDINGS]
    for req in snap.requests.values():
        want = -(-req.needed_tokens // snap.block_size)
        if len(req.block_ids) != want and not (req.rewound and len(req.block_ids) > want):
            findings.append(Finding(
                "block_table_mismatch", f"request:{req.request_id}",
                f"request {req.request_id}'s block table has {len(req.block_ids)} blocks of {snap.block_size} tokens "
                f"for {req.needed_tokens:,} computed and scheduled tokens, which need {want} (step {snap.step})",
                (req.request_id,), tuple(req.block_ids[-4:])))
            if len(findings) >= MAX_FINDINGS:
                break
    return findings[:MAX_FINDINGS]


def _check_block(snap: PoolSnapshot, block_id: int, held_by: list[tuple[str, int]]) -> list[Finding]:
    block = snap.blocks.get(block_id)
    ids = tuple(rid for rid, _ in held_by[:MAX_NAMED])
    names = ", ".join(f"{rid} (block {pos})" for rid, pos in held_by[:6])
    out = []

    def violation(what: str) -> None:
        out.append(Finding("ownership_violation", f"block:{block_id}", f"vLLM block {block_id} {what}", ids,
                           (block_id,)))

    ref_cnt = block.ref_cnt if block is not None else 0
    if ref_cnt < len(held_by):
        violation(f"is held by {len(held_by)} live request(s) [{names}] but the pool counts ref_cnt {ref_cnt}: it "
                  "can be handed to another request while they still read it")
    block_hash = block.block_hash if block is not None else None
    if len(held_by) > 1 and block_hash is None:
        violation(f"is shared by {len(held_by)} requests [{names}] but is not a full, hashed prefix-cache block: "
                  "one request's private block was handed to another")
    if block_hash is None:
        return out
    for rid, position in held_by:
        own = snap.requests[rid].own_hashes
        if position >= len(own):
            if len(held_by) > 1:
                violation(f"is shared by [{names}] but {rid}'s own tokens do not fill block {position}: a shared "
                          "block must be full of each holder's own tokens")
            continue
        if own[position] != block_hash:
            violation(f"at position {position} of request {rid}'s table holds content hashed {block_hash.hex()[:16]}, "
                      f"but {rid}'s own tokens there hash to {own[position].hex()[:16]}: another request's data")
    return out


def capacity_finding(max_model_len: int, num_blocks: int, block_size: int) -> dict:
    """The advertised window (`max_model_len`) against the pool's real capacity, in the
    shape of engine/capacity.py's findings (the GUI's capacity banner reads it)."""
    usable = max(0, num_blocks - 1)  # vLLM keeps block 0 as its null block
    limit = usable * block_size
    exceeds = max_model_len > limit
    detail = f"{usable:,} blocks x {block_size} tokens (block 0 is vLLM's null block)"
    what = "vLLM's KV block pool"
    verb = "exceeds" if exceeds else "fits"
    message = (f"context window {max_model_len:,} tokens {verb} {what} ({limit:,} tokens = {detail})"
               + (f" by {max_model_len - limit:,} tokens" if exceeds else ""))
    return {"limit": "pool:vllm", "window_tokens": max_model_len, "limit_tokens": limit, "detail": detail,
            "exceeds": exceeds, "shortfall_tokens": max(0, max_model_len - limit),
            "coverage": round(limit / max_model_len, 6) if max_model_len else 1.0, "message": message}
