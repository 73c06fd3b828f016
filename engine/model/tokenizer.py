"""TextTokenizer: `tokenizer.json` through the `tokenizers` library (text use only)."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from engine.errors import CheckpointError

TOKENIZER_FILE = "tokenizer.json"


class TextTokenizer:
    def __init__(self, tokenizer: Tokenizer, path: Path):
        self._tok = tokenizer
        self.path = path

    @classmethod
    def from_dir(cls, model_dir: Path) -> "TextTokenizer":
        """Raises CheckpointError naming the file when it is missing or unreadable."""
        path = Path(model_dir) / TOKENIZER_FILE
        if not path.is_file():
            raise CheckpointError(f"missing file: {path} (needed to encode text prompts)")
        try:
            return cls(Tokenizer.from_file(str(path)), path)
        except Exception as exc:  # tokenizers raises a bare Exception on bad JSON
            raise CheckpointError(f"{path}: cannot load tokenizer ({exc})") from None

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def token_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)
