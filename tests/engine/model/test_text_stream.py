"""TextStream hands out, piece by piece, exactly the text a full decode gives, for the
repository's byte-level tokenizer and a Llama-2-style one (byte fallback, a leading-space
marker stripped at the start), and decodes a window, not the whole output, per token."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models

from engine.model.text_stream import TextStream
from engine.model.tokenizer import TextTokenizer
from tests.conftest import REPO


def llama2_style() -> Tokenizer:
    """<unk>, <s>, </s>, 256 byte tokens <0x00>..<0xFF>, then words with the ▁ marker."""
    words = ["▁the", "▁cat", "▁sat", "▁on", "ed", "s", "▁", "mat", "▁é", "日本"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    vocab.update({w: len(vocab) + i for i, w in enumerate(words)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens(["<s>", "</s>"])
    return tok


def decode_fn(tok: Tokenizer):
    return lambda ids: tok.decode(ids, skip_special_tokens=True)


TOKENIZERS = {
    "byte-level (pagewarden-copy)": TextTokenizer.from_dir(REPO / "resources" / "models" / "pagewarden-copy")._tok,
    "llama-2 style": llama2_style(),
}


def streamed(decode, ids: list[int], step_sizes: list[int]) -> str:
    stream, out, i = TextStream(decode), [], 0
    sizes = iter(step_sizes)
    while i < len(ids):
        i = min(len(ids), i + next(sizes, 1))
        out.append(stream.delta(ids[:i]))
    return "".join(out)


CHARS = st.text(alphabet=st.sampled_from("a é日😀 \n.") | st.characters(codec="utf-8"), max_size=25)


@pytest.mark.parametrize("name", TOKENIZERS)
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_the_pieces_join_to_the_full_decode(name, data):
    """Valid text, its ids fed 1-4 at a time: the pieces are the full decode, exactly."""
    tok = TOKENIZERS[name]
    decode = decode_fn(tok)
    ids = tok.encode(data.draw(CHARS)).ids
    steps = data.draw(st.lists(st.integers(1, 4), max_size=60))
    assert streamed(decode, ids, steps) == decode(ids)


@pytest.mark.parametrize("name", TOKENIZERS)
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_any_ids_stream_without_error_and_exactly_when_they_are_valid_utf8(name, data):
    """Any ids (split characters, special tokens, invalid bytes): no error; where the full
    decode has no U+FFFD the pieces are exactly it (invalid bytes decode differently alone
    than in a run, with any incremental scheme, vLLM's too)."""
    tok = TOKENIZERS[name]
    decode = decode_fn(tok)
    ids = data.draw(st.lists(st.integers(0, tok.get_vocab_size(with_added_tokens=True) - 1), max_size=60))
    steps = data.draw(st.lists(st.integers(1, 4), max_size=60))
    full, pieces = decode(ids), streamed(decode, ids, steps)
    if "\ufffd" not in full:
        assert pieces == full


@pytest.mark.parametrize("name", TOKENIZERS)
def test_real_text_with_multibyte_characters_streams_exactly(name):
    tok = TOKENIZERS[name]
    text = "the cat sat on the mat: 日本語, émigré, 😀 done"
    ids = tok.encode(text).ids
    full = decode_fn(tok)(ids)
    assert streamed(decode_fn(tok), ids, []) == full
    assert "日本語" in full and "😀" in full


def test_half_a_character_is_held_until_it_is_whole():
    tok = TOKENIZERS["llama-2 style"]
    smile = [tok.token_to_id(f"<0x{b:02X}>") for b in "😀".encode()]
    stream, decode = TextStream(decode_fn(tok)), decode_fn(tok)
    assert stream.delta(smile[:1]) == "" and stream.delta(smile[:3]) == ""
    assert stream.delta(smile) == "😀"
    assert decode(smile) == "😀"


def test_each_token_decodes_a_window_not_the_whole_output():
    tok = TOKENIZERS["byte-level (pagewarden-copy)"]
    seen = []

    def decode(ids):
        seen.append(len(ids))
        return tok.decode(ids, skip_special_tokens=True)

    stream, ids = TextStream(decode), tok.encode("a" * 2000).ids
    assert len(ids) >= 1000
    for i in range(1, len(ids) + 1):
        stream.delta(ids[:i])
    assert max(seen) <= 4  # a full decode per token would reach len(ids)
