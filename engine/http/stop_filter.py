"""StopFilter: OpenAI `stop` sequences over streamed text.

The engine stops on token ids; `stop` strings are the frontend's. Text that could still
become the start of a stop sequence is held back until it cannot, so no byte of a stop
sequence ever reaches the client, streaming or not.
"""

from __future__ import annotations


class StopFilter:
    def __init__(self, stops: tuple[str, ...] = ()):
        self.stops = tuple(s for s in stops if s)
        self.held = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """The part of `text` (after what was held) that is safe to send now."""
        if self.stopped or not text:
            return ""
        if not self.stops:
            return text
        buf = self.held + text
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped, self.held = True, ""
            return buf[:min(hits)]
        keep = max((_partial(buf, s) for s in self.stops), default=0)
        self.held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep]

    def flush(self) -> str:
        """At the end of the text: what was held back (it never became a stop sequence)."""
        out, self.held = ("" if self.stopped else self.held), ""
        return out


def _partial(buf: str, stop: str) -> int:
    """Length of the longest end of `buf` that is a proper start of `stop`."""
    for k in range(min(len(stop) - 1, len(buf)), 0, -1):
        if buf.endswith(stop[:k]):
            return k
    return 0
