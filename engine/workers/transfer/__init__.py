"""KV transfer from a prefill pool to a decode pool (invariants I3 and I4: docs/INVARIANTS.md).

The decode worker reserves pages for a request and describes its prompt pages in a
Reservation (manifest.py). The prefill worker sends the prompt's pages as chunk messages
(send.py: build_transfer / iter_transfer). The decode worker feeds every message it receives
to a TransferReceiver (receive.py), which checks each chunk against the reservation before
writing a byte, and marks the pages WRITTEN, stamping the request's writer tags, only after
the last chunk.

A chunk message is `[msgpack header, page frame, page frame, ...]`. The header repeats the
whole manifest (request, epoch, tokens, decode pages and their epochs, layout), so every
chunk is checked on its own, and carries an xxh3-64 checksum of each of its pages.
"""
