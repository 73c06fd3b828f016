"""The default model repeats its context, any bytes: through our engine, token for token as
HF transformers, from `main.py generate --prompt`; its weights are the ones
resources/models/build_copy_model.py computes, and it fits the size budget."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from engine.config import DEFAULT_MODEL_DIR, REPO_ROOT, EngineConfig
from engine.core import Engine
from engine.guard.canaries import PROMPT_FORM
from engine.guard.scenarios import BOS, copy_prompt
from engine.request import SamplingParams
from tests.hf_checkpoints import hf_greedy


def _engine(**engine) -> Engine:
    return Engine(EngineConfig().replace(model={"dtype": "float32", "device": "cpu"},
                                         engine={"kernels": "torch", "max_batch": 16, **engine}))


MODELS = REPO_ROOT / "resources" / "models"


def _eval_cases():
    """Cases of eval_copy_model.py (markers of every alphabet at the start of a text), from a
    seed neither the eval (987654321) nor the build uses."""
    sys.path.insert(0, str(MODELS))
    try:
        from eval_copy_model import make_case
    finally:
        sys.path.remove(str(MODELS))
    rng = random.Random(31337)
    return [(alphabet, n, *make_case(rng, alphabet, n))
            for alphabet in ("lower", "mixed", "printable", "utf8") for n in (48, 300, 1100, 1880)]


def test_the_default_model_is_the_built_one_and_small(tmp_path):
    proc = subprocess.run([sys.executable, str(MODELS / "build_copy_model.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    committed = sorted(p.name for p in DEFAULT_MODEL_DIR.iterdir())
    assert committed == sorted(p.name for p in tmp_path.iterdir())
    for name in committed:  # byte for byte: the weights are what the script computes
        assert (DEFAULT_MODEL_DIR / name).read_bytes() == (tmp_path / name).read_bytes(), name
    assert json.loads((DEFAULT_MODEL_DIR / "build_meta.json").read_text())["method"].startswith("constructed")
    assert sum(p.stat().st_size for p in DEFAULT_MODEL_DIR.iterdir()) <= 20 * 2**20


@pytest.mark.parametrize("ngram", [0, 9])
def test_the_build_refuses_an_ngram_it_cannot_hold(tmp_path, ngram):
    proc = subprocess.run([sys.executable, str(MODELS / "build_copy_model.py"), "--out", str(tmp_path),
                           "--ngram", str(ngram)], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and f"got {ngram}" in proc.stderr


def test_markers_of_every_alphabet_come_back_through_the_engine():
    cases = _eval_cases()
    engine = _engine()
    instruction = PROMPT_FORM.format(text="").encode()
    prompts = [[BOS, *text, *instruction] for _, _, _, text in cases]
    requests = engine.generate(prompts, SamplingParams(max_new_tokens=max(len(m) for _, _, m, _ in cases) + 4))
    missed = [(alphabet, n, m.decode("utf-8", "replace")) for (alphabet, n, m, _), r in zip(cases, requests)
              if not bytes(t for t in r.output_ids if t < 256).startswith(m)]
    assert not missed, missed


def test_fresh_markers_come_back_through_the_engine_at_short_and_long_contexts():
    rng = random.Random(424242)  # not a seed the eval uses
    cases = [copy_prompt(rng, n) for n in (60, 90, 300, 700, 1200, 1950)]
    engine = _engine()
    requests = engine.generate([ids for ids, _ in cases], SamplingParams(max_new_tokens=48))
    copied = [secret in bytes(t for t in r.output_ids if t < 256).decode("latin-1")
              for (_, secret), r in zip(cases, requests)]
    assert all(copied), copied


def test_engine_equals_hf_on_copy_prompts():
    rng = random.Random(99)
    prompts = [copy_prompt(rng, n)[0] for n in (50, 400, 1000)]
    prompts += [[BOS, *text, *PROMPT_FORM.format(text="").encode()] for _, n, _, text in _eval_cases() if n < 1000]
    engine = _engine()
    requests = engine.generate(prompts, SamplingParams(max_new_tokens=40, ignore_eos=True))
    assert [r.output_ids for r in requests] == hf_greedy(DEFAULT_MODEL_DIR, prompts, 40)


def test_generate_cli_repeats_the_text():
    text = "pagewarden canary 7f3k2p9q1x8m4n6b"
    proc = subprocess.run([sys.executable, "main.py", "generate", "--prompt", PROMPT_FORM.format(text=text),
                           "--max-new-tokens", "48", "--json"], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["text"].startswith(text), out["text"]
