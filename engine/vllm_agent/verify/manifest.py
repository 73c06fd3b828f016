"""TransferManifest: what a producer (prefill) vLLM says it handed over, and the consumer's check.

The manifest travels inside vLLM's own `kv_transfer_params` (returned by the producer's
`request_finished`, passed on by the router to the consumer's request), under MANIFEST_KEY,
as plain JSON: no side channel. It binds the transfer to the request (the router's request id
and a hash of the prompt's token ids), says how many tokens and blocks the producer computed,
and carries one 64-bit digest per block position, over all layers (hex strings: JSON readers
outside Python lose integers past 2**53).

The consumer treats anything it cannot check as a failed load: no manifest, one that does
not parse, one for another request or prompt, one that claims more blocks than the request
needs, one without digests (the producer never reported them), or a loaded block the manifest
does not list with the same rows. Nothing here raises on bad input.

Plain Python (no vLLM, no torch).
"""

from __future__ import annotations

import hashlib
import re
import struct
from dataclasses import dataclass

MANIFEST_KEY = "pagewarden_manifest"
VERSION = 1
MAX_BLOCKS = 1 << 17  # 4M tokens at block size 32: past any window vLLM serves today
MAX_ID_CHARS = 512
_VLLM_SUFFIX = re.compile(r"-[0-9a-f]{8}$")  # vLLM appends 8 random hex characters to every request id
_HEX16 = re.compile(r"^[0-9a-f]{16}$")


def external_id(request_id: str) -> str:
    """The id the router gave both halves of a request (X-Request-Id), without the random tail
    vLLM adds to make its internal ids unique: the one name a producer and a consumer share."""
    return _VLLM_SUFFIX.sub("", str(request_id))


def prompt_sha(token_ids) -> str:
    """A hash of the prompt's token ids: a manifest made for another prompt fails on it even
    when the request ids were reused."""
    ids = list(token_ids or ())
    return hashlib.sha256(struct.pack(f"<{len(ids)}q", *ids)).hexdigest()[:32]


def block_rows(tokens: int, block_size: int) -> list[int]:
    """Tokens held by each block position of a prompt of `tokens` tokens: full blocks, then
    the partial last one."""
    full, tail = divmod(tokens, block_size)
    return [block_size] * full + ([tail] if tail else [])


@dataclass(frozen=True)
class Manifest:
    request: str  # the external id (see external_id)
    prompt_sha: str
    tokens: int
    block_size: int
    digests: tuple[int, ...] | None  # one per block position; None: the producer never reported them

    @property
    def rows(self) -> list[int]:
        return block_rows(self.tokens, self.block_size)


def new_manifest(request_id: str, token_ids, block_size: int) -> dict:
    """The wire form the producer's scheduler can fill in at request_finished; digests come
    from the producer's worker (fill_digests) and are absent until then."""
    tokens = len(list(token_ids or ()))
    return {"v": VERSION, "request": external_id(request_id), "prompt_sha": prompt_sha(token_ids),
            "tokens": tokens, "block_size": int(block_size), "blocks": len(block_rows(tokens, block_size))}


def fill_digests(wire: dict, digests: dict[int, int]) -> bool:
    """Put the per-position digests in, only when every block position has one (a manifest
    with some digests missing stays without: the consumer then recomputes, fail closed)."""
    want = range(int(wire["blocks"]))
    if not all(p in digests for p in want):
        return False
    wire["digests"] = [f"{digests[p] & 0xFFFF_FFFF_FFFF_FFFF:016x}" for p in want]
    return True


def parse(params) -> Manifest | str:
    """The manifest in a request's kv_transfer_params, or why there is none that can be used."""
    if not isinstance(params, dict) or MANIFEST_KEY not in params:
        return "no PageWarden manifest came with the request"
    raw = params[MANIFEST_KEY]
    if not isinstance(raw, dict):
        return f"the manifest does not parse: a {type(raw).__name__}, not a map"
    if raw.get("v") != VERSION:
        return f"the manifest does not parse: version {str(raw.get('v'))[:20]!r}, expected {VERSION}"
    request, sha = raw.get("request"), raw.get("prompt_sha")
    if not isinstance(request, str) or not 0 < len(request) <= MAX_ID_CHARS:
        return "the manifest does not parse: no request id"
    if not isinstance(sha, str) or len(sha) != 32:
        return "the manifest does not parse: no prompt hash"
    ints = {k: raw.get(k) for k in ("tokens", "block_size", "blocks")}
    if not all(type(v) is int for v in ints.values()):
        return "the manifest does not parse: tokens, block_size and blocks must be integers"
    tokens, block_size, blocks = ints["tokens"], ints["block_size"], ints["blocks"]
    if not (0 < block_size <= 4096 and 0 < blocks <= MAX_BLOCKS and 0 < tokens <= blocks * block_size):
        return f"the manifest does not parse: {tokens} tokens in {blocks} blocks of {block_size}"
    if blocks != len(block_rows(tokens, block_size)):
        return f"the manifest does not parse: {tokens} tokens need {len(block_rows(tokens, block_size))} blocks " \
               f"of {block_size}, it lists {blocks}"
    digests = raw.get("digests")
    if digests is None:
        return Manifest(request, sha, tokens, block_size, None)
    if not isinstance(digests, list) or len(digests) != blocks or \
            not all(isinstance(d, str) and _HEX16.match(d) for d in digests):
        return f"the manifest does not parse: digests must be {blocks} hex strings of 16 characters"
    return Manifest(request, sha, tokens, block_size, tuple(int(d, 16) for d in digests))


def expected_digests(found: Manifest | str, *, request_id: str, token_ids, block_size: int,
                     loaded: dict[int, int]) -> dict[int, int] | str:
    """The digest each loaded block position must have, or why no loaded block can be trusted.

    loaded: block position -> rows the consumer's inner connector says it wrote there.
    """
    if isinstance(found, str):
        return found
    ids = list(token_ids or ())
    need = len(block_rows(len(ids), block_size))
    if found.request != external_id(request_id):
        return f"the manifest is for request {found.request[:80]!r}, not {external_id(request_id)[:80]!r}"
    if found.block_size != block_size:
        return f"the manifest's block size is {found.block_size}, this vLLM's is {block_size}"
    if len(found.rows) > need:
        return f"the manifest claims {len(found.rows)} blocks; request {external_id(request_id)[:80]!r} " \
               f"holds {need} ({len(ids)} prompt tokens)"
    if found.prompt_sha != prompt_sha(ids) or found.tokens != len(ids):
        return f"the manifest is for another prompt ({found.tokens} tokens, hash {found.prompt_sha[:12]}); " \
               f"this request's has {len(ids)} (hash {prompt_sha(ids)[:12]})"
    if found.digests is None:
        return "the manifest has no digests: the producer never reported what it saved, so nothing can be checked"
    rows = found.rows
    out = {}
    for position, wrote in sorted(loaded.items()):
        if position >= len(rows) or rows[position] != wrote:
            listed = f"{rows[position]} rows" if position < len(rows) else "nothing"
            return f"block position {position} was loaded with {wrote} rows; the manifest lists {listed} there"
        out[position] = found.digests[position]
    return out
