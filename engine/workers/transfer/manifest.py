"""What both sides of a KV transfer agree on: the page layout, the reservation (the
manifest a transfer must match), page checksums and chunking."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import xxhash

from engine.kv.page_pool import MAX_SLOT
from engine.wire.protocol import ProtocolError, field_of

OP = "kv_chunk"
EVENT_KINDS = ("complete", "mismatch", "late", "garbage", "timeout")
DEFAULT_CHUNK_BYTES = 2 << 20  # bench/transfer.py: 1-2 MB chunks pipelined best here
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
MAX_EPOCH = (1 << 63) - 1
INT_FIELDS = ("tokens", "chunk", "chunks", "first", "count", "first_token")
LIST_FIELDS = ("pages", "page_epochs", "checksums")



@dataclass(frozen=True)
class KVLayout:
    """What one page holds; both pools must agree on it byte for byte."""

    dtype: str  # "float32" | "bfloat16" | "float16"
    page_shape: tuple[int, ...]  # pool.data.shape[1:]
    bytes_per_page: int

    @classmethod
    def of(cls, pool) -> "KVLayout":
        """The layout of `pool`'s pages. Raises ValueError for a dtype that is not transferred."""
        name = DTYPE_NAMES.get(pool.data.dtype)
        if name is None:
            raise ValueError(f"pool {pool.name!r}: dtype {pool.data.dtype} cannot be transferred")
        shape = tuple(int(d) for d in pool.data.shape[1:])
        return cls(name, shape, math.prod(shape) * pool.data.element_size())

    def to_wire(self) -> dict:
        """msgpack-able form."""
        return {"dtype": self.dtype, "page_shape": list(self.page_shape), "bytes_per_page": self.bytes_per_page}

    def difference(self, wire: dict) -> str | None:
        """None when `wire` describes this layout, else a sentence naming the first field that differs."""
        for key, mine in self.to_wire().items():
            theirs = wire.get(key)
            if theirs != mine:
                return f"layout {key} {theirs!r} != {mine!r} of the decode pool"
        return None


@dataclass
class Reservation:
    """Decode side: the pages it granted for one request's prompt, as the transfer must fill them."""

    request_id: str
    slot: int  # the request's engine-wide slot (owner id in both pools)
    epoch: int  # reservation epoch: a counter unique per decode worker
    tokens: int  # prompt length the transfer must carry
    pages: np.ndarray  # int32 decode pages in token order, ceil(tokens / page_size) - first_page of them
    page_epochs: np.ndarray  # int64 pool.epoch of each page at allocation
    # the prompt's leading pages the decode side's prefix cache already holds: the transfer
    # carries the prompt's pages from this index on (pages[0] is prompt page first_page)
    first_page: int = 0

    def __post_init__(self):
        self.pages = np.asarray(self.pages, dtype=np.int32).reshape(-1)
        self.page_epochs = np.asarray(self.page_epochs, dtype=np.int64).reshape(-1)

    def pages_carried(self, page_size: int) -> int:
        """Pages the transfer fills: the prompt's, less those the decode side has cached."""
        return -(-self.tokens // page_size) - self.first_page

    def to_wire(self) -> dict:
        """msgpack-able form (plain ints and lists)."""
        return {
            "request_id": self.request_id, "slot": int(self.slot), "epoch": int(self.epoch),
            "tokens": int(self.tokens), "pages": self.pages.tolist(), "page_epochs": self.page_epochs.tolist(),
            "first_page": int(self.first_page),
        }

    @classmethod
    def from_wire(cls, d: dict) -> "Reservation":
        """Parse to_wire()'s form. Raises ProtocolError naming the first bad field."""
        if not isinstance(d, dict):
            raise ProtocolError(f"reservation must be a map, got {type(d).__name__}")
        request_id = field_of(d, "request_id", "str", max_len=1024)
        if not request_id:
            raise ProtocolError("field 'request_id' is empty")
        slot = field_of(d, "slot", "int", low=0, high=MAX_SLOT)
        epoch = field_of(d, "epoch", "int", low=0, high=MAX_EPOCH)
        tokens = field_of(d, "tokens", "int", low=1, high=1 << 40)
        first_page = field_of(d, "first_page", "int", default=0, low=0, high=1 << 40)
        pages = field_of(d, "pages", "list[int]")
        page_epochs = field_of(d, "page_epochs", "list[int]")
        if not pages:
            raise ProtocolError("field 'pages' is empty")
        if len(page_epochs) != len(pages):
            raise ProtocolError(f"field 'page_epochs' has {len(page_epochs)} items for {len(pages)} pages")
        if min(pages) < 0 or max(pages) > MAX_SLOT:
            raise ProtocolError(f"field 'pages' holds a page id outside 0..{MAX_SLOT}")
        if len(set(pages)) != len(pages):
            raise ProtocolError("field 'pages' lists a page twice")
        if min(page_epochs) < 0 or max(page_epochs) > MAX_EPOCH:
            raise ProtocolError("field 'page_epochs' holds a negative or oversized epoch")
        return cls(request_id, slot, epoch, tokens, np.array(pages), np.array(page_epochs), first_page)


def page_checksum(buf) -> int:
    """xxh3-64 of one page's bytes (any contiguous buffer). An integrity check, not a MAC:
    it catches torn, short, stale or misrouted pages at ~18 GB/s a core, where crc32 ran
    at ~4 GB/s and made checksumming most of a transfer's cost (bench/RESULTS.md)."""
    return xxhash.xxh3_64_intdigest(buf)


def pages_per_chunk(bytes_per_page: int, chunk_bytes: int) -> int:
    """How many pages one chunk message carries: as many as fit chunk_bytes, at least one."""
    return max(1, int(chunk_bytes) // int(bytes_per_page))


def byte_rows(data: torch.Tensor) -> np.ndarray:
    # [pages, bytes_per_page] uint8 numpy view sharing memory with a contiguous CPU tensor
    return data.view(torch.uint8).reshape(data.shape[0], -1).numpy()
