"""The decode side of a KV transfer: TransferReceiver checks every chunk against its
reservation before writing a byte (I3), holds in-flight pages until the transfer ends
(I4) and reports every outcome as a TransferEvent."""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import torch

from engine.errors import IsolationError
from engine.wire.page_tags import NO_WRITER, PageState, pack_tag
from engine.wire.protocol import ProtocolError, field_of, frame_bytes, unpack_header
from engine.workers.transfer.manifest import (
    EVENT_KINDS,
    INT_FIELDS,
    LIST_FIELDS,
    OP,
    KVLayout,
    Reservation,
    byte_rows,
    page_checksum,
)

_REMEMBERED_ENDINGS = 4096  # finished request ids kept only to explain late chunks



@dataclass
class TransferEvent:
    """What one received message (or a timeout) did to a transfer."""

    kind: str  # "complete" | "mismatch" | "late" | "garbage" | "timeout"
    request_id: str | None
    detail: str  # sentence naming what differed, e.g. "page count 3 != reserved 4"
    first_token: int | None = None
    pages: list[int] = field(default_factory=list)  # the reservation's (late: the chunk's)
    sender: str = ""


class _Outcome(Exception):
    """Ends the handling of one message with an event (internal control flow)."""

    def __init__(self, kind: str, detail: str, request_id: str | None = None, pages=None, sender: str = ""):
        super().__init__(detail)
        self.event = TransferEvent(kind, request_id, detail, pages=list(pages or []), sender=sender)


@dataclass
class _Transfer:
    res: Reservation
    page_list: list[int]  # res.pages as ints, compared with each header in one C call
    epoch_list: list[int]
    since: float  # expect() time until the first chunk arrives, then that chunk's time
    next_chunk: int = 0
    next_page: int = 0
    chunks: int | None = None
    first_token: int | None = None
    tokens: int | None = None  # the manifest's token count (trusting mode keeps it)
    written: list[int] = field(default_factory=list)  # reservation page indices written


class TransferReceiver:
    """Decode side: checks each chunk against its reservation, writes verified pages, and
    marks them WRITTEN with the request's tags after the last one. Never raises on input;
    never frees pages (on mismatch or timeout the caller scrubs and frees event.pages)."""

    def __init__(self, pool, *, clock=time.monotonic):
        self.pool = pool
        self.layout = KVLayout.of(pool)
        self.clock = clock
        self.counts = {kind: 0 for kind in EVENT_KINDS}
        self.bytes_written = 0
        self._rows = byte_rows(pool.data) if pool.data.device.type == "cpu" else None
        self._pending: dict[str, _Transfer] = {}
        self._ended: OrderedDict[str, str] = OrderedDict()  # request_id -> how it ended
        # The I3 and I4 defences. Off (only with --allow-faults) the receiver still sees every
        # problem and reports it in `notes`, but writes what came and lets the request on.
        self.verify_manifest = True
        self.verify_ownership = True
        self.notes: list[TransferEvent] = []

    # ---- reservations -----------------------------------------------------------------
    def expect(self, reservation: Reservation) -> None:
        """Start waiting for `reservation`'s transfer. Raises ValueError when the request is
        already expected or its page count does not hold its tokens, and IsolationError
        when a page is not the slot's IN_FLIGHT page of the stated epoch."""
        res, pool = reservation, self.pool
        if res.request_id in self._pending:
            raise ValueError(f"request {res.request_id}: a transfer is already expected")
        needed = res.pages_carried(pool.page_size)
        if res.tokens < 1 or len(res.pages) != needed or len(res.page_epochs) != len(res.pages):
            raise ValueError(f"request {res.request_id}: {len(res.pages)} pages / {len(res.page_epochs)} epochs "
                             f"for {res.tokens} tokens; {needed} needed")
        if res.pages.min() < 0 or res.pages.max() >= pool.num_pages:
            raise ValueError(f"request {res.request_id}: page outside 0..{pool.num_pages - 1}")
        problem = self._ownership_problem(res, res.pages, res.page_epochs)
        if problem:
            raise IsolationError(problem)
        self._ended.pop(res.request_id, None)
        self._pending[res.request_id] = _Transfer(res, res.pages.tolist(), res.page_epochs.tolist(), self.clock())

    def cancel(self, request_id: str) -> None:
        """Stop waiting for `request_id`'s transfer: chunks arriving later are dropped as late.
        Its pages are the caller's to free once cancel returns. Unknown ids are ignored."""
        if self._pending.pop(request_id, None) is not None:
            self._remember(request_id, "it was cancelled")

    def pending(self) -> list[str]:
        """Request ids whose transfer is expected and not finished."""
        return list(self._pending)

    def expire(self, now: float, timeout_s: float) -> list[TransferEvent]:
        """`timeout` events for transfers expected (or, once started, started) more than
        timeout_s before `now` (the receiver's clock); they stop being expected."""
        events = []
        for rid, t in list(self._pending.items()):
            if now - t.since > timeout_s:
                got = f"{t.next_chunk} of {t.chunks} chunks" if t.chunks else "no chunk"
                detail = (f"transfer of request {rid} not complete {now - t.since:.1f}s after "
                          f"{'its first chunk' if t.chunks else 'the reservation'} (timeout {timeout_s:g}s; got {got})")
                events.append(self._end(t, "timeout", detail))
                self.counts["timeout"] += 1
        return events

    # ---- messages ---------------------------------------------------------------------
    def on_message(self, frames: list) -> TransferEvent | None:
        """Handle one received multipart message; an event when it ended a transfer or was
        rejected, None when it was a verified chunk that is not the last. Never raises."""
        try:
            event = self._on_chunk(frames)
        except _Outcome as outcome:
            event = outcome.event
        except Exception as exc:  # noqa: BLE001 - input must never take the decode worker down
            event = TransferEvent("garbage", None, f"undecodable transfer message ({type(exc).__name__}: {exc})")
        if event is not None:
            self.counts[event.kind] += 1
        return event

    def _on_chunk(self, frames) -> TransferEvent | None:
        header, rid, epoch, sender = self._parse(frames)
        t = self._pending.get(rid)
        if t is None or epoch < t.res.epoch:
            # never written: the pages may belong to someone else by now (I4)
            why = self._ended.get(rid, "no transfer is expected for it")
            if t is not None:
                why = f"epoch {epoch} is older than the pending reservation's {t.res.epoch}"
            pages = header.get("pages")
            pages = [p for p in pages if type(p) is int] if isinstance(pages, list) else []
            detail = f"chunk {_shown(header.get('chunk'))} of request {rid} dropped: {why}"
            raise _Outcome("late", detail, rid, pages, sender)
        for name in INT_FIELDS:
            _typed(header, name, "int", rid, sender)
        for name in LIST_FIELDS:
            _typed(header, name, "list", rid, sender)
        _typed(header, "layout", "map", rid, sender)
        frames, tags, prov = _split_extras(header, frames, self.pool.page_size)
        problem = self._header_problem(t, header, epoch, len(frames) - 1)
        if problem:
            if self.verify_manifest:
                self._fail(t, problem, sender)
            self._note(t, "mismatch_accepted", problem, sender)
        views = [_byte_view(f, rid, sender) for f in frames[1:]]
        first = header["first"] if self.verify_manifest else t.next_page
        span = range(first, min(first + len(views), len(t.page_list)))
        problem = self._content_problem(t, header, views) or _tags_problem(header, tags)
        if problem:
            if self.verify_manifest:
                self._fail(t, problem, sender)
            self._note(t, "mismatch_accepted", problem, sender)
        keep = [j for j in range(len(span)) if views[j].nbytes == self.layout.bytes_per_page]
        pages = t.res.pages[[span[j] for j in keep]]
        problem = self._ownership_problem(t.res, pages, t.res.page_epochs[[span[j] for j in keep]])
        if problem:
            if self.verify_ownership:
                self._fail(t, problem, sender)
            self._note(t, "late_write_landed", problem, sender)  # written anyway: the defence is off
        self._write(pages, [views[j] for j in keep])
        # I1's tags land with the bytes they describe (a reader with a stale table may look
        # before the transfer completes), as does the audit's provenance
        self._stamp_tokens(t, pages, [span[j] for j in keep], None if tags is None else tags[keep])
        self._record_provenance(t, pages, None if prov is None else prov[keep])
        t.written.extend(span[j] for j in keep)
        if t.next_chunk == 0:
            t.since, t.chunks, t.first_token = self.clock(), header["chunks"], header["first_token"]
            t.tokens = header["tokens"]
        t.next_chunk, t.next_page = t.next_chunk + 1, first + len(span)
        last_announced = header.get("chunk") == header.get("chunks", 0) - 1
        if t.next_page < len(t.page_list) and not (last_announced and not self.verify_manifest):
            return None
        return self._complete(t, sender)

    def _note(self, t: _Transfer, kind: str, detail: str, sender: str) -> None:
        self.notes.append(TransferEvent(kind, t.res.request_id, f"request {t.res.request_id}: {detail}",
                                        pages=t.res.pages.tolist(), sender=sender))

    def take_notes(self) -> list[TransferEvent]:
        notes, self.notes = self.notes, []
        return notes

    def _stamp_tokens(self, t: _Transfer, pages: np.ndarray, indices: list[int], tags) -> None:
        """token_writer of the written pages: the sender's tags (its own prompt slots already
        carry this request's decode tag); without them, the request's tag on the prompt's slots
        and no writer on the rest."""
        if not len(pages):
            return
        pool, res = self.pool, t.res
        if tags is None:
            positions = ((np.asarray(indices, dtype=np.int64)[:, None] + res.first_page) * pool.page_size
                         + np.arange(pool.page_size))
            own = pack_tag(np.int64(res.slot), res.page_epochs[indices].astype(np.int64))[:, None]
            tags = np.where(positions < res.tokens, own, NO_WRITER)
        index = torch.from_numpy(pages.astype(np.int64)).to(pool.device)
        pool.token_writer[index] = torch.from_numpy(np.ascontiguousarray(tags, dtype=np.int64)).to(pool.device)

    def _record_provenance(self, t: _Transfer, pages: np.ndarray, prov) -> None:
        table = getattr(self.pool, "provenance", None)
        if table is None or not len(pages):
            return
        table[pages] = prov if prov is not None else t.res.slot
        if getattr(self.pool, "identity", None) is not None:
            self.pool.identity[pages] = 0  # whose prefix it is: the decode worker says, once complete

    def _parse(self, frames) -> tuple[dict, str, int, str]:
        if not isinstance(frames, (list, tuple)) or not frames:
            raise _Outcome("garbage", f"transfer message must be a non-empty list of frames, got {_shown(frames)}")
        try:
            header = unpack_header(frames[0])
        except ProtocolError as exc:
            raise _Outcome("garbage", f"bad transfer header: {exc}") from None
        if header.get("op") != OP:
            raise _Outcome("garbage", f"op {_shown(header.get('op'))} is not {OP!r}")
        rid = header.get("request_id")
        if not isinstance(rid, str):
            raise _Outcome("garbage", f"field 'request_id' must be str, got {_shown(rid)}")
        sender = header.get("sender", "")
        sender = sender if isinstance(sender, str) else ""
        epoch = _typed(header, "epoch", "int", rid, sender)
        return header, rid, epoch, sender

    def _header_problem(self, t: _Transfer, h: dict, epoch: int, frame_count: int) -> str | None:
        """The manifest and chunk fields against the reservation and the chunks before."""
        res, n = t.res, len(t.page_list)
        if epoch != res.epoch:
            return f"epoch {epoch} != reserved {res.epoch}"
        if h["tokens"] != res.tokens:
            return f"token count {h['tokens']} != reserved {res.tokens}"
        if h.get("first_page", 0) != res.first_page:
            return (f"first_page {_shown(h.get('first_page', 0))} != reserved {res.first_page} "
                    f"(pages the decode side holds in its prefix cache)")
        if len(h["pages"]) != n:
            return (f"page count {len(h['pages'])} != reserved {n} (ceil({res.tokens} / {self.pool.page_size})"
                    f" - {res.first_page} cached)")
        if h["pages"] != t.page_list:
            return _first_difference("page ids", h["pages"], t.page_list)
        if len(h["page_epochs"]) != n:
            return f"page_epochs has {len(h['page_epochs'])} entries for {n} pages"
        if h["page_epochs"] != t.epoch_list:
            return _first_difference("page_epochs", h["page_epochs"], t.epoch_list)
        layout_problem = self.layout.difference(h["layout"])
        if layout_problem:
            return layout_problem
        if h["chunk"] != t.next_chunk:
            return f"chunk {h['chunk']} != expected {t.next_chunk} (chunks arrive in order)"
        if t.chunks is not None and h["chunks"] != t.chunks:
            return f"chunks {h['chunks']} != {t.chunks} announced by chunk 0"
        if not 1 <= h["chunks"] <= n:
            return f"chunks {h['chunks']} outside 1..{n} for {n} pages"
        if t.first_token is not None and h["first_token"] != t.first_token:
            return f"first_token {h['first_token']} != {t.first_token} announced by chunk 0"
        if h["first"] != t.next_page:
            return f"first {h['first']} != expected {t.next_page}, where the previous chunk ended"
        if h["count"] != frame_count:
            return f"count {h['count']} != page frames present {frame_count}"
        if h["count"] < 1 or h["first"] + h["count"] > n:
            return f"count {h['count']} from page index {h['first']} does not fit the transfer's {n} pages"
        last, ends = h["chunk"] == h["chunks"] - 1, h["first"] + h["count"] == n
        if last and not ends:
            return f"chunk {h['chunk']} is the last of {h['chunks']} but pages end at {h['first'] + h['count']} of {n}"
        if ends and not last:
            return f"chunk {h['chunk']} of {h['chunks']} already carries the last page of {n}"
        if len(h["checksums"]) != h["count"]:
            return f"checksums has {len(h['checksums'])} entries for count {h['count']}"
        return None

    def _content_problem(self, t: _Transfer, h: dict, views: list[memoryview]) -> str | None:
        """Frame sizes and checksums."""
        size = self.layout.bytes_per_page
        first = h["first"] if h["first"] + len(views) <= len(t.page_list) else t.next_page
        if first + len(views) > len(t.page_list):
            return f"{len(views)} page frames from index {first} overrun the reservation's {len(t.page_list)} pages"
        for j, view in enumerate(views):
            if view.nbytes != size:
                return (f"frame {j + 1} (page {t.page_list[first + j]}) is {view.nbytes:,} bytes, "
                        f"bytes_per_page is {size:,}")
        for j, (view, sent) in enumerate(zip(views, h["checksums"])):
            got = page_checksum(view)
            if got != sent:
                return (f"checksum of page {t.page_list[first + j]} (index {first + j}) is {got:#010x}, "
                        f"sender's {_shown(sent)}")
        return None

    def _ownership_problem(self, res: Reservation, pages: np.ndarray, epochs: np.ndarray) -> str | None:
        # I4: the pages must still be this slot's IN_FLIGHT pages of the reserved epoch
        pool = self.pool
        bad = np.nonzero((pool.owner[pages] != res.slot) | (pool.epoch[pages] != epochs)
                         | (pool.state[pages] != PageState.IN_FLIGHT))[0]
        if not len(bad):
            return None
        j, page = int(bad[0]), int(pages[bad[0]])
        return (f"decode page {page} is owner {int(pool.owner[page])}, epoch {int(pool.epoch[page])}, "
                f"state {PageState(int(pool.state[page])).name}; the reservation of request {res.request_id} "
                f"needs owner {res.slot}, epoch {int(epochs[j])}, IN_FLIGHT")

    def _write(self, pages: np.ndarray, views: list[memoryview]) -> None:
        if self._rows is not None:
            for page, view in zip(pages, views):
                self._rows[page] = np.frombuffer(view, dtype=np.uint8)
        else:
            # one host->device copy per chunk instead of one per page
            staged = np.empty((len(views), self.layout.bytes_per_page), dtype=np.uint8)
            for j, view in enumerate(views):
                staged[j] = np.frombuffer(view, dtype=np.uint8)
            data = self.pool.data
            block = torch.from_numpy(staged).to(data.device).view(data.dtype).reshape(len(views), *data.shape[1:])
            data.index_copy_(0, torch.from_numpy(pages.astype(np.int64)).to(data.device), block)
        self.bytes_written += len(views) * self.layout.bytes_per_page

    def _complete(self, t: _Transfer, sender: str) -> TransferEvent:
        res, pool = t.res, self.pool
        problem = self._ownership_problem(res, res.pages, res.page_epochs)
        if problem and self.verify_ownership:
            self._fail(t, problem, sender)
        # the code that wrote the K/V stamps the writer tag (I1), then the pages become readable;
        # trusting a short transfer stamps only what was really written
        done = np.array(sorted(set(t.written)), dtype=np.int64)
        pages, epochs = res.pages[done], res.page_epochs[done]
        tokens = res.tokens if self.verify_manifest else min(res.tokens, t.tokens or 0)
        index = torch.from_numpy(pages.astype(np.int64)).to(pool.device)
        filled = np.clip(tokens - (done + res.first_page) * pool.page_size, 0, pool.page_size)
        pool.writer[index] = torch.from_numpy(pack_tag(np.int64(res.slot), epochs)).to(pool.device)
        pool.filled[index] = torch.from_numpy(filled.astype(np.int32)).to(pool.device)
        pool.mark_dirty(pages)
        mine = pages[pool.owner[pages] == res.slot]
        if len(mine):
            pool.set_state(res.slot, mine, PageState.WRITTEN)
        event = self._end(t, "complete", f"{res.tokens} tokens in {len(res.pages)} pages of request "
                                         f"{res.request_id} verified and written", sender)
        event.first_token = t.first_token
        return event

    def _fail(self, t: _Transfer, detail: str, sender: str) -> None:
        # raising ends the message's handling; the pages stay the caller's to scrub and free
        event = self._end(t, "mismatch", f"request {t.res.request_id}: {detail}", sender)
        raise _Outcome("mismatch", event.detail, event.request_id, event.pages, sender)

    def _end(self, t: _Transfer, kind: str, detail: str, sender: str = "") -> TransferEvent:
        rid = t.res.request_id
        del self._pending[rid]
        self._remember(rid, "its transfer already completed" if kind == "complete" else f"its transfer failed ({kind})")
        return TransferEvent(kind, rid, detail, pages=t.res.pages.tolist(), sender=sender)

    def _remember(self, request_id: str, how: str) -> None:
        self._ended[request_id] = how
        self._ended.move_to_end(request_id)
        if len(self._ended) > _REMEMBERED_ENDINGS:
            self._ended.popitem(last=False)


def _tags_problem(header: dict, tags) -> str | None:
    if tags is None or "tags_checksum" not in header:
        return None
    got = page_checksum(np.ascontiguousarray(tags).view(np.uint8).reshape(-1))
    if got != header["tags_checksum"]:
        return f"checksum of the token tags is {got:#010x}, sender's {_shown(header['tags_checksum'])}"
    return None


def _split_extras(header: dict, frames: list, page_size: int):
    """The optional trailing frames the header announces, last first: provenance rows
    ([count, page_size] int32, `prov`) and token tags ([count, page_size] int64, `tags`).
    A frame of the wrong size is not taken (it stays a page frame: the checks say why)."""
    prov = tags = None
    if header.get("prov") is True and len(frames) >= 3:
        frames, prov = _split_rows(frames, page_size, "<i4")
    if header.get("tags") is True and len(frames) >= 3:
        frames, tags = _split_rows(frames, page_size, "<i8")
    return frames, tags, prov


def _split_rows(frames: list, page_size: int, dtype: str):
    raw = frame_bytes(frames[-1])
    row_bytes = page_size * np.dtype(dtype).itemsize
    if not raw or len(raw) % row_bytes or len(raw) // row_bytes > len(frames) - 1:
        return frames, None
    return frames[:-1], np.frombuffer(raw, dtype=dtype).reshape(-1, page_size)


def _typed(header: dict, name: str, kind: str, rid: str | None, sender: str):
    # a field of the wrong type is garbage, not a mismatch: the request stays expected
    try:
        return field_of(header, name, kind)
    except ProtocolError as exc:
        raise _Outcome("garbage", f"request {rid}: {exc}", rid, sender=sender) from None


def _byte_view(frame, rid: str, sender: str) -> memoryview:
    try:
        # numpy arrays and bytes in-process; zmq.Frame (copy=False receives) through .buffer
        view = memoryview(frame) if not hasattr(frame, "buffer") else memoryview(frame_bytes(frame))
        return view if view.format == "B" and view.ndim == 1 else view.cast("B")
    except (AttributeError, TypeError, ValueError):
        raise _Outcome("garbage", f"request {rid}: a page frame of type {type(frame).__name__} is not a "
                                  f"contiguous byte buffer", rid, sender=sender) from None


def _first_difference(what: str, got: list, want: list) -> str:
    j = next(j for j, (a, b) in enumerate(zip(got, want)) if a != b)
    return f"{what} differ at index {j}: {_shown(got[j])} != reserved {want[j]}"


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
