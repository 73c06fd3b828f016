"""TextStream: a request's output text, piece by piece, at a cost that does not grow with
its length.

Decoding all of a request's ids again for every new token costs O(n) per token, O(n^2) per
request: at 4,096 output tokens, 8 million token decodes for one request, on the
supervisor's one thread. TextStream decodes a short window instead: the ids not yet handed
out as text, behind the ids of the previous piece as context, so that tokenizers whose
decoding of a token depends on the one before (a leading-space marker, byte fallback) give
the same text as a full decode (the scheme vLLM's detokenizer uses). A piece that ends in
half a UTF-8 character (U+FFFD) is held back until a later token completes it.
"""

from __future__ import annotations

from collections.abc import Callable


class TextStream:
    def __init__(self, decode: Callable[[list[int]], str]):
        self._decode = decode
        self._prefix = 0  # the context window: ids[_prefix:_read], the last piece's ids
        self._read = 0  # ids before this were handed out as text

    def delta(self, ids: list[int]) -> str:
        """What ids (all of the request's output so far) add to the text handed out; ''
        while a character is incomplete or the new ids show nothing (special tokens)."""
        if len(ids) <= self._read:
            return ""
        before = self._decode(ids[self._prefix:self._read]) if self._read > self._prefix else ""
        text = self._decode(ids[self._prefix:])
        if len(text) <= len(before) or text.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(ids)
        return text[len(before):]
