"""PoolSnapshot: what vLLM's scheduler holds at one step, as plain data (no vLLM objects).

The connector copies it out of vLLM's KVCacheManager inside `build_connector_meta` (the
scheduler's thread, between two steps, so it is consistent); the checks and the page book
read only this.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RequestView:
    request_id: str
    block_ids: tuple[int, ...]  # the request's block table, in token order
    needed_tokens: int  # tokens the table must cover after this step: computed + scheduled
    prompt_len: int
    output_tokens: int
    own_hashes: tuple[bytes, ...]  # the hash of the request's own tokens, per full block, in order
    # vLLM moved its computed tokens back after a KV load failed (it recomputes from the first
    # failed block, keeping the blocks it holds): its table may be longer than its tokens need
    rewound: bool = False
    salt_tag: str | None = None  # its cache_salt as tenant_share.salt_tag names it (None: no salt), never the salt
    tenant: str | None = None  # its tenant as the operator's tenant_field maps it (None: not mapped)


@dataclass(frozen=True)
class BlockView:
    ref_cnt: int  # the pool's own count of holders
    block_hash: bytes | None  # the content hash of a full, cached block (None: partial or uncached)


@dataclass(frozen=True)
class PoolSnapshot:
    time: float
    step: int
    num_blocks: int
    block_size: int
    requests: dict[str, RequestView]
    blocks: dict[int, BlockView]  # every block some request holds
    finished: dict[str, str] = field(default_factory=dict)  # request id -> finish reason, since the last one
    waiting: int = 0  # requests vLLM has taken in that hold no block yet (queued or preempted)
