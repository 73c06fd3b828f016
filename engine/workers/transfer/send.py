"""The prefill side of a KV transfer: the chunk messages that carry a request's prompt
pages (and each token slot's writer tag) to its decode reservation."""

from __future__ import annotations

from typing import Iterator

import numpy as np
import torch

from engine.wire.page_tags import pack_tag
from engine.wire.protocol import pack_header
from engine.workers.transfer.manifest import (
    DEFAULT_CHUNK_BYTES,
    OP,
    KVLayout,
    Reservation,
    byte_rows,
    page_checksum,
    pages_per_chunk,
)


def build_transfer(pool, src_pages: np.ndarray, reservation: dict, *, first_token: int,
                   chunk_bytes: int = DEFAULT_CHUNK_BYTES, sender: str = "", tokens: int | None = None) -> list[list]:
    """Prefill side: the multipart messages (each a list of frames) that carry the prompt's
    pages `src_pages` (prefill pool pages, token order) to the reservation's decode pages.

    On CPU the page frames are views of the pool's memory: send them with copy=False and
    keep the pages unfreed until the send completes (track=True). `tokens` is the prompt
    length actually prefilled (default: the reservation's); a shorter one yields an honest
    short manifest that the receiver rejects. Raises ProtocolError for a malformed
    reservation and ValueError when src_pages do not hold `tokens` or cannot fit it.
    """
    return list(iter_transfer(pool, src_pages, reservation, first_token=first_token,
                              chunk_bytes=chunk_bytes, sender=sender, tokens=tokens))


def iter_transfer(pool, src_pages: np.ndarray, reservation: dict | Reservation, *, first_token: int,
                  chunk_bytes: int = DEFAULT_CHUNK_BYTES, sender: str = "",
                  tokens: int | None = None) -> Iterator[list]:
    """build_transfer's messages one at a time, each checksummed just before it is yielded,
    so that checksumming chunk i+1 overlaps the socket sending chunk i. Checks its
    arguments now and raises as build_transfer does."""
    res = reservation if isinstance(reservation, Reservation) else Reservation.from_wire(reservation)
    tokens = res.tokens if tokens is None else int(tokens)
    src = np.asarray(src_pages, dtype=np.int64).reshape(-1)
    needed = pool.pages_for_tokens(tokens) - res.first_page  # the decode side's cached pages stay home
    if tokens < 1 or tokens > res.tokens:
        raise ValueError(f"request {res.request_id}: {tokens} tokens cannot fill a reservation of {res.tokens}")
    if len(src) != needed:
        raise ValueError(f"request {res.request_id}: {len(src)} source pages for {tokens} tokens, {needed} needed")
    if len(src) and (src.min() < 0 or src.max() >= pool.num_pages):
        raise ValueError(f"request {res.request_id}: source page outside 0..{pool.num_pages - 1}")
    layout = KVLayout.of(pool)
    per_chunk = pages_per_chunk(layout.bytes_per_page, chunk_bytes)
    manifest = {
        "op": OP, "request_id": res.request_id, "epoch": int(res.epoch), "tokens": tokens,
        "pages": res.pages[:needed].tolist(), "page_epochs": res.page_epochs[:needed].tolist(),
        "layout": layout.to_wire(), "first_token": int(first_token), "sender": sender,
        "chunks": -(-needed // per_chunk), "first_page": int(res.first_page),
    }
    tags = transfer_tags(pool, src, res, needed)
    provenance = None if getattr(pool, "provenance", None) is None else pool.provenance[src]
    return _chunk_messages(manifest, host_page_rows(pool, src), per_chunk, tags, provenance)


def transfer_tags(pool, src: np.ndarray, res: "Reservation", needed: int) -> np.ndarray:
    """The token tags the shipped pages carry into the decode pool ([pages, page_size] int64):
    a slot this request wrote in the prefill pool (its tag is the request's own for the page's
    current epoch) becomes the request's tag for the decode page's epoch; any other slot keeps
    the tag of whoever wrote it there, so I1 on the decode side names the same writer as the
    bytes that travel with it."""
    rows = pool.token_writer[torch.from_numpy(src).to(pool.device)].cpu().numpy()
    own = rows == pack_tag(np.int64(res.slot), pool.epoch[src])[:, None]
    decode_tags = pack_tag(np.int64(res.slot), res.page_epochs[:needed].astype(np.int64))
    return np.where(own, decode_tags[:, None], rows).astype("<i8")


def _chunk_messages(manifest: dict, rows: list, per_chunk: int, tags: np.ndarray,
                    provenance=None) -> Iterator[list]:
    for chunk, first in enumerate(range(0, len(rows), per_chunk)):
        frames = rows[first : first + per_chunk]
        header = {**manifest, "chunk": chunk, "first": first, "count": len(frames),
                  "checksums": [page_checksum(f) for f in frames], "tags": True}
        extras = [memoryview(np.ascontiguousarray(tags[first : first + len(frames)])).cast("B")]
        header["tags_checksum"] = page_checksum(extras[0])  # I1 trusts them as much as the bytes
        if provenance is not None:
            # the audit's ground truth travels with the data: whose content each token slot holds
            header["prov"] = True
            prov = np.ascontiguousarray(provenance[first : first + len(frames)], dtype="<i4")
            extras.append(memoryview(prov).cast("B"))
        yield [pack_header(header), *frames, *extras]


def host_page_rows(pool, pages: np.ndarray) -> list[np.ndarray]:
    """One 1-D uint8 array per page holding its bytes: views of the pool on CPU, rows of
    one gathered host copy on any other device."""
    index = np.asarray(pages, dtype=np.int64).reshape(-1)
    if pool.data.device.type == "cpu":
        rows = byte_rows(pool.data)
        return [rows[p] for p in index]
    gathered = pool.data.index_select(0, torch.from_numpy(index).to(pool.data.device)).cpu()
    rows = byte_rows(gathered)
    return [rows[j] for j in range(len(index))]
