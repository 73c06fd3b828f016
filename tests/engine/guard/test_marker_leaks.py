"""reproduce's black-box evidence: pieces of another request's marker in an output."""

from __future__ import annotations

import random

from engine.guard.reproduce import FRAGMENT, marker_leaks
from engine.guard.scenarios import FORM_IDS, PROMPT_FORM, copy_prompt

A, B, C = "aaaa1111bbbb2222cccc3333", "zzzz9999yyyy8888xxxx7777", "qqqq5555wwww4444eeee0000"
D, E, F = "qqqq5555kkkk6666", "mmmm3333nnnn", "pppp0000eeee0000"


def _leaks(outputs: dict[str, str]) -> list[tuple]:
    markers = dict(zip(("r1", "r2", "r3", "r4", "r5", "r6"), (A, B, C, D, E, F)))
    work = [{"marker": m, "prompt_ids": [256, *PROMPT_FORM.format(text=m).encode()]} for m in markers.values()]
    ends = [{"token_ids": [*outputs.get(rid, "").encode(), 257]} for rid in markers]
    return [(x["reader"], x["source"], x["seen"], x["whole"]) for x in marker_leaks(list(markers), work, ends)]


def test_whole_markers_and_unique_pieces_are_leaks_naming_their_source():
    assert _leaks({"r1": f"x {B} y", "r2": "..5555wwww.."}) == [
        ("r1", "r2", B, True), ("r2", "r3", "5555wwww", False)]


def test_own_text_short_pieces_and_ambiguous_pieces_are_not_leaks():
    assert FRAGMENT == 6
    assert _leaks({"r1": A,  # its own marker
                   "r3": "qqqq5555",  # D's piece, but also in r3's own prompt
                   "r4": "aaaa1",  # five characters of A: too short to name anyone
                   "r5": "eeee0000"}) == []  # in both C and F: names nobody for sure


def test_copy_prompts_fill_n_tokens_and_repeat_the_marker():
    rng = random.Random(5)
    for n in (80, 300, 1900):
        ids, secret = copy_prompt(rng, n, repeat=True)
        text = bytes(ids[1:]).decode()
        assert len(ids) == n and ids[0] == 256 and 24 <= len(secret) <= 40
        assert text.startswith(secret) and text.count(secret) >= (n - 1 - FORM_IDS) // (len(secret) + 1)
    ids, secret = copy_prompt(rng, 300)
    assert bytes(ids[1:]).decode().count(secret) == 1
