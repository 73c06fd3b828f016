"""PrefixCache over a real PagePool: chain keys, salts, holders, LRU eviction, withdrawal."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.errors import IsolationError, PoolExhausted
from engine.kv.page_pool import PageLayout, PagePool
from engine.kv.prefix_cache import PrefixCache
from engine.kv.prefix_keys import chain_keys, content_identities, reusable_pages, salt_of
from engine.wire.page_tags import FREE_OWNER, SHARED_OWNER, PageState, pack_tag

PS = 4


def pool(pages: int = 16) -> PagePool:
    return PagePool("decode", pages, PageLayout(1, 1, 2, PS, torch.float32))


def written(cache: PrefixCache, slot: int, tokens: list[int], salt: str, total_pages: int):
    """A request that took what the cache had, then wrote and offered its own full pages."""
    full = len(tokens) // PS
    table = cache.allocate_with_prefix(slot, tokens, salt, total_pages, reusable_pages(len(tokens), PS),
                                       chain_keys(tokens, PS, salt, full))
    own = table.own_pages()
    cache.pool.set_state(slot, own, PageState.WRITTEN)
    cache.pool.page_key[torch.from_numpy(table.pages[:full].astype(np.int64))] = torch.from_numpy(table.keys[:full])
    cache.offer(table, tokens, salt, full)
    return table


def test_keys_chain_over_tokens_and_salt():
    tokens = list(range(12))
    a = chain_keys(tokens, PS, "tenant:acme", 3)
    assert len(set(a.tolist())) == 3 and (a > 0).all()
    assert (chain_keys(tokens, PS, "tenant:acme", 3) == a).all()
    assert not (chain_keys(tokens, PS, "tenant:globex", 3) == a).any()  # the salt reaches every page
    changed = tokens.copy()
    changed[1] = 99
    b = chain_keys(changed, PS, "tenant:acme", 3)
    assert not (b == a).any()  # a change in page 0 changes every later key (the chain)
    with pytest.raises(ValueError, match="need 16 tokens"):
        chain_keys(tokens, PS, "", 4)
    # the audit's identity is another hash of the same facts: equal when they are, never the key
    ident = content_identities(tokens, PS, "tenant:acme", 3)
    assert (content_identities(tokens, PS, "tenant:acme", 3) == ident).all()
    assert not (ident == a).any() and not (content_identities(tokens, PS, "x", 3) == ident).any()


def test_salt_follows_the_scope():
    assert salt_of("off", "acme", "s") is None
    assert salt_of("tenant", "acme", None) == "tenant:acme"
    assert salt_of("tenant", "acme", "s") == salt_of("global", "globex", "s") == "salt:s"
    assert salt_of("global", "acme", None) == salt_of("global", "globex", None) == ""
    assert salt_of("tenant", "acme", "tenant:acme") != salt_of("tenant", "acme", None)  # no spoofing a tenant
    assert reusable_pages(8, PS) == 1 and reusable_pages(9, PS) == 2 and reusable_pages(1, PS) == 0


def test_same_salt_shares_full_pages_and_a_different_salt_does_not():
    cache = PrefixCache(pool())
    first = written(cache, 1, list(range(10)), "tenant:acme", 4)
    assert cache.pool.owner[first.pages[:2]].tolist() == [SHARED_OWNER] * 2  # the two full pages
    assert cache.pool.owner[first.pages[2]] == 1
    second = cache.allocate_with_prefix(2, list(range(10)), "tenant:acme", 4, 2,
                                        chain_keys(list(range(10)), PS, "tenant:acme", 2))
    assert second.pages[:2].tolist() == first.pages[:2].tolist()
    assert second.shared.tolist() == [True, True, False, False]
    assert second.expected_tags()[:2].tolist() == pack_tag(np.int64(1), first.epochs[:2]).tolist()
    assert cache.pool.holders[first.pages[:2]].tolist() == [2, 2]
    other = cache.allocate_with_prefix(3, list(range(10)), "tenant:globex", 4, 2,
                                       chain_keys(list(range(10)), PS, "tenant:globex", 2))
    assert not other.shared.any() and not set(other.pages) & set(first.pages)


def test_the_salt_ignored_fault_matches_on_tokens_and_the_keys_still_differ():
    cache = PrefixCache(pool(), salt_ignored=True)
    first = written(cache, 1, list(range(10)), "tenant:acme", 4)
    keys = chain_keys(list(range(10)), PS, "tenant:globex", 2)
    other = cache.allocate_with_prefix(3, list(range(10)), "tenant:globex", 4, 2, keys)
    assert other.pages[:2].tolist() == first.pages[:2].tolist()  # the bug: another tenant's pages
    # ...and what the kernels compare says so: the page keys are acme's, the reader computed globex's
    page_keys = cache.pool.page_key[torch.from_numpy(other.pages[:2].astype(np.int64))].numpy()
    assert not (page_keys == other.expected_keys()[:2]).any()


def test_release_makes_pages_evictable_oldest_first_and_scrubs_them():
    p = pool(8)
    cache = PrefixCache(p)
    a = written(cache, 1, [1] * 8 + [5], "s", 3)
    b = written(cache, 2, [2] * 8 + [5], "s", 3)
    cache.release(a)
    cache.release(b)
    assert p.free_pages == 4 and p.evictable_pages == 4 and p.available_pages == 8
    p.data.fill_(7.0)
    grant = cache.allocate(9, 6)  # needs two of the idle pages: a's, released first
    assert set(a.pages[:2].tolist()) <= set(grant.pages.tolist())
    assert not set(b.pages[:2].tolist()) & set(grant.pages.tolist())
    assert cache.counts.evicted == 2 and len(cache) == 2
    assert float(p.data[torch.from_numpy(a.pages[:2].astype(np.int64))].abs().sum()) == 0.0  # scrubbed
    with pytest.raises(PoolExhausted):
        cache.allocate(10, 3)  # two idle pages and nothing free: all or nothing
    assert len(cache) == 2 and p.evictable_pages == 2  # nothing was evicted for an allocation that failed


def test_a_held_page_is_never_evicted():
    p = pool(4)
    cache = PrefixCache(p)
    a = written(cache, 1, [1] * 8 + [5], "s", 3)  # holds both its shared pages
    with pytest.raises(PoolExhausted):
        cache.allocate(2, 2)
    assert p.owner[a.pages[:2]].tolist() == [SHARED_OWNER] * 2


def test_withdrawn_pages_go_when_their_last_holder_does_and_nobody_new_takes_them():
    p = pool(8)
    cache = PrefixCache(p)
    a = written(cache, 1, [1] * 8 + [5], "s", 3)
    assert cache.withdraw([a.pages[0]]) == [int(a.pages[0])]
    again = cache.allocate_with_prefix(2, [1] * 8 + [5], "s", 3, 2, chain_keys([1] * 8, PS, "s", 2))
    assert not again.shared.any()  # the chain breaks at the withdrawn first page
    cache.release(a)
    assert p.owner[a.pages[0]] == FREE_OWNER  # scrubbed and freed, not kept idle
    assert p.owner[a.pages[1]] == SHARED_OWNER and p.evictable_pages == 1


def test_free_shared_refuses_a_held_or_private_page():
    p = pool(8)
    cache = PrefixCache(p)
    a = written(cache, 1, [1] * 8 + [5], "s", 3)
    with pytest.raises(IsolationError, match="1 holder"):
        p.free_shared([a.pages[0]])
    with pytest.raises(IsolationError, match="owner 1"):
        p.free_shared([a.pages[2]])


def test_refs_count_holders_of_shared_pages_and_one_for_owned_ones():
    p = pool(8)
    cache = PrefixCache(p)
    a = written(cache, 1, [1] * 8 + [5], "s", 3)
    cache.allocate_with_prefix(2, [1] * 8 + [6], "s", 3, 2, chain_keys([1] * 8, PS, "s", 2))
    refs = p.metadata_snapshot()["refs"]
    assert refs[a.pages[:2]].tolist() == [2, 2] and refs[a.pages[2]] == 1
    assert int(refs.sum()) == 2 + 2 + 1 + 1  # b's own page
