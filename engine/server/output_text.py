"""OutputText: the supervisor's tokenizer, loaded on first use, and the text of a request's output."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from engine.errors import PageWardenError
from engine.model.text_stream import TextStream
from engine.server.request_record import RequestRecord

if TYPE_CHECKING:  # loaded on first use: a server serving token ids never needs it
    from engine.model.tokenizer import TextTokenizer


class OutputText:
    def __init__(self, model_dir: Callable[[], Path]):
        """model_dir(): the running model's directory (a reconfigure may change it)."""
        self._model_dir = model_dir
        self._tokenizer: TextTokenizer | None = None

    @property
    def tokenizer(self) -> TextTokenizer:
        """Raises PageWardenError when the model has no usable tokenizer."""
        if self._tokenizer is None:
            from engine.model.tokenizer import TextTokenizer

            self._tokenizer = TextTokenizer.from_dir(self._model_dir())
        return self._tokenizer

    def forget(self) -> None:
        """The model may have changed: load its tokenizer again on next use."""
        self._tokenizer = None

    def of(self, ids: list[int]) -> str | None:
        """All of `ids` as text; None without a tokenizer."""
        try:
            return self.tokenizer.decode(ids)
        except PageWardenError:
            return None

    def delta(self, rec: RequestRecord) -> str | None:
        """The text rec's newest tokens add (None without a tokenizer): a short window
        decoded, not all of its output again (engine/model/text_stream.py)."""
        if rec.text is None:
            try:
                rec.text = TextStream(self.tokenizer.decode)
            except PageWardenError:
                return None
        try:
            return rec.text.delta(rec.output_ids)
        except PageWardenError:
            return None
