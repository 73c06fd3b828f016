"""Prefix keys: what a full prompt page holds, as a chain hash of (parent key, its tokens), rooted
in the request's salt.

Two requests get the same key for page j only when their first (j + 1) pages of tokens are
the same and so is their salt; the key of a page therefore names its whole prefix. Keys are
63-bit and never 0 (0 marks a page that holds no keyed prefix), so they fit an int64 tensor the
decode kernels compare. xxh3-64 is an integrity hash, not a MAC: a key is compared only with
a key the engine computed itself, never taken from a client.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import hashlib

import numpy as np
import numpy.typing as npt
import xxhash

KEY_MASK = (1 << 63) - 1
TokenIds: TypeAlias = npt.NDArray[np.integer[Any]] | list[int]


def salt_of(scope: str, tenant: str, cache_salt: str | None) -> str | None:
    """The salt a request's prefix keys are rooted in, or None when its pages are not shared
    (scope "off"). A given cache_salt always salts; without one, "tenant" salts by the tenant
    and "global" does not salt at all (every unsalted request shares with every other)."""
    if scope == "off":
        return None
    if cache_salt is not None:
        return "salt:" + cache_salt
    return "tenant:" + tenant if scope == "tenant" else ""


def chain_keys(tokens: TokenIds, page_size: int, salt: str, pages: int) -> npt.NDArray[np.int64]:
    """The prefix keys of the first `pages` full pages of `tokens` under `salt`."""
    ids = np.asarray(tokens, dtype="<i8")
    if pages * page_size > len(ids):
        raise ValueError(f"{pages} full pages of {page_size} need {pages * page_size} tokens; there are {len(ids)}")
    keys = np.empty(pages, dtype=np.int64)
    parent = xxhash.xxh3_64_intdigest(b"pagewarden-prefix\0" + salt.encode("utf-8", "surrogatepass"))
    for j in range(pages):
        digest = xxhash.xxh3_64_intdigest(ids[j * page_size:(j + 1) * page_size].tobytes(),
                                          seed=parent) & KEY_MASK
        parent = keys[j] = digest or 1
    return keys


def reusable_pages(prompt_len: int, page_size: int) -> int:
    """Leading prompt pages a request may take from the cache: full ones, leaving at least its
    last prompt token to compute (that token's logits give the first output token). Every full
    prompt page (prompt_len // page_size) may be offered to the cache once written."""
    return max(0, (prompt_len - 1) // page_size)


def content_identities(tokens: TokenIds, page_size: int, salt: str, pages: int) -> npt.NDArray[np.int64]:
    """The audit's ground truth of what the first `pages` full pages hold: a hash of the salt and
    the whole prefix up to each page's end, by another hash (BLAKE2b) and another construction
    than chain_keys, so that the provenance audit does not share the detector's arithmetic. A
    read of another request's content is its own data when the identities are equal."""
    ids = np.asarray(tokens, dtype="<i8")
    running = hashlib.blake2b(salt.encode("utf-8", "surrogatepass") + b"\0", digest_size=8)
    out = np.empty(pages, dtype=np.int64)
    for j in range(pages):
        running.update(ids[j * page_size:(j + 1) * page_size].tobytes())
        out[j] = (int.from_bytes(running.copy().digest(), "little") & KEY_MASK) or 1
    return out
