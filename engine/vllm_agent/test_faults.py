"""The vLLM side's test hook: every way a test breaks vLLM's state or a KV transfer on purpose,
in one module, refused unless the process was started with PAGEWARDEN_ALLOW_FAULTS=1.

The connectors hold no sabotage code of their own: they ask `refuse_unless_allowed` at start
(a fault named in their config without the variable is a ValueError, and vLLM does not start),
and call in here only when a fault was configured. Production configs name none, so none of
this runs.

- the agent (`PageWardenConnector`, test_fault): `break_scheduler_state` once, one of
  AGENT_FAULTS, to prove its checks see it; "salt_ignored" instead makes vLLM's block hash leave
  out the cache_salt of requests that ask for it (`ignore_salt_when_asked`), the vllm#44701 class;
- the verifying connector (test_fault): TRANSFER_FAULTS. "short_transfer" leaves each
  consumer load's last blocks unwritten while the inner connector reports it finished (the
  2026 incident); "per_request" lets each request's kv_transfer_params[TEST_KEY] say whether
  its load gets that fault and whether it is checked, so that one consumer serves a test's
  every row.
"""

from __future__ import annotations

import logging
import os

ALLOW_ENV = "PAGEWARDEN_ALLOW_FAULTS"
AGENT_FAULTS = ("swap_block", "ref_drop", "extra_block", "share_partial", "salt_ignored")
TRANSFER_FAULTS = ("short_transfer", "per_request")
# per_request: {"fault": bool, "verify": bool} in kv_transfer_params; salt_ignored: "salt_ignored" in vllm_xargs
TEST_KEY = "pagewarden_test"

logger = logging.getLogger("vllm.pagewarden.test_faults")


def allowed() -> bool:
    return os.environ.get(ALLOW_ENV) == "1"


def refuse_unless_allowed(fault, choices: tuple[str, ...], what: str) -> None:
    """A configured fault that is unknown, or asked for without ALLOW_ENV=1: ValueError."""
    if fault is not None and (fault not in choices or not allowed()):
        raise ValueError(f"test_fault {fault!r} refused: one of {', '.join(choices)}, and only with "
                         f"{ALLOW_ENV}=1 ({what})")


# ---- the agent: vLLM's scheduler state, broken once -------------------------------------
def break_scheduler_state(fault: str, manager, block_pool, live) -> bool:
    """Break vLLM's block tables or counts once, as `fault` says; True when it was applied
    (False: not enough live requests of the right shape yet, try again next snapshot)."""
    tables = [(rid, t) for rid, t in manager.req_to_blocks.items() if rid in live and t]
    full = [(rid, t) for rid, t in tables if len(t) >= 2 and t[0].block_hash is not None]
    if fault == "swap_block" and len(full) >= 2 and full[0][1][0] is not full[1][1][0]:
        (_, a), (_, b) = full[0], full[1]
        a[0], b[0] = b[0], a[0]
    elif fault == "ref_drop" and full:
        full[0][1][0].ref_cnt -= 1
    elif fault == "extra_block" and tables:
        tables[0][1].extend(block_pool.get_new_blocks(1))
    elif fault == "share_partial" and len(tables) >= 2:
        (_, a), (_, b) = tables[0], tables[1]
        partial = b[-1]
        if partial.block_hash is not None:
            return False
        partial.ref_cnt += 1
        a.append(partial)
    else:
        return False
    return True


def ignore_salt_when_asked(kv_cache_utils) -> None:
    """salt_ignored: from now on, in this process, vLLM's block hash (`kv_cache_utils`, the module
    vllm.v1.core.kv_cache_utils, passed in by the connector) leaves out the cache_salt of each
    request whose `vllm_xargs` carry {TEST_KEY: "salt_ignored"} (the others keep theirs, so one
    vLLM serves a test's every case). Such requests share prefix blocks across salts, as under a
    hash that drops the salt (vllm#44701, sglang#37160). The request's own `cache_salt` is kept:
    the agent sees the salts that should have kept the blocks apart."""
    real = kv_cache_utils.generate_block_hash_extra_keys

    def without_salt(request, start_token_idx, end_token_idx, start_mm_idx):
        keys, mm_idx = real(request, start_token_idx, end_token_idx, start_mm_idx)
        extra = getattr(request.sampling_params, "extra_args", None) or {}
        if keys and extra.get(TEST_KEY) == "salt_ignored":
            keys = tuple(k for k in keys if k[0] != "cache_salt") or None
        return keys, mm_idx

    kv_cache_utils.generate_block_hash_extra_keys = without_salt
    logger.warning("PageWarden test fault salt_ignored: block hashes leave out the cache_salt of requests asking "
                   "%s=salt_ignored", TEST_KEY)


# ---- the verifying connector: a short transfer ------------------------------------------
def switches(fault, verify: bool, kv_transfer_params) -> tuple[bool, bool]:
    """(check this load, give it the short transfer). Only "per_request" lets a request's
    params choose; anywhere else they are ignored."""
    if fault != "per_request":
        return verify, fault == "short_transfer"
    params = kv_transfer_params if isinstance(kv_transfer_params, dict) else {}
    test = params.get(TEST_KEY) if isinstance(params.get(TEST_KEY), dict) else {}
    return verify and test.get("verify", True) is not False, test.get("fault") is True


def unwritten_blocks(request_id: str, block_ids: list[int], fault_blocks: int) -> list[int]:
    """The blocks of one faulted load that stay unwritten: its last `fault_blocks`, never the
    first (so the reply starts out right and the leak shows later in it)."""
    left = block_ids[max(1, len(block_ids) - fault_blocks):]
    if left:
        logger.warning("PageWarden test fault short_transfer: request %s: blocks %s left unwritten, the load "
                       "reported finished", request_id, left)
    return left
