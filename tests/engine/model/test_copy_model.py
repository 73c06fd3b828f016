"""The trained default model repeats its context: through our engine, token for token as
HF transformers, from `main.py generate --prompt`, and it fits the size budget."""

from __future__ import annotations

import json
import random
import subprocess
import sys

from engine.config import DEFAULT_MODEL_DIR, REPO_ROOT, EngineConfig
from engine.core import Engine
from engine.guard.canaries import PROMPT_FORM
from engine.guard.scenarios import copy_prompt
from engine.request import SamplingParams
from tests.hf_checkpoints import hf_greedy


def _engine(**engine) -> Engine:
    return Engine(EngineConfig().replace(model={"dtype": "float32", "device": "cpu"},
                                         engine={"kernels": "torch", "max_batch": 16, **engine}))


def test_the_default_model_is_the_trained_one_and_small():
    meta = json.loads((DEFAULT_MODEL_DIR / "train_meta.json").read_text())
    assert meta["steps"] == meta["args"]["steps"]  # it ran its whole deterministic schedule
    assert sum(p.stat().st_size for p in DEFAULT_MODEL_DIR.iterdir()) <= 20 * 2**20


def test_fresh_markers_come_back_through_the_engine_at_short_and_long_contexts():
    rng = random.Random(424242)  # not a training seed
    cases = [copy_prompt(rng, n) for n in (60, 90, 300, 700, 1200, 1950)]
    engine = _engine()
    requests = engine.generate([ids for ids, _ in cases], SamplingParams(max_new_tokens=48))
    copied = [secret in bytes(t for t in r.output_ids if t < 256).decode("latin-1")
              for (_, secret), r in zip(cases, requests)]
    assert sum(copied) >= 5, copied  # the eval script measures the rate over 500 markers per length


def test_engine_equals_hf_on_copy_prompts():
    rng = random.Random(99)
    prompts = [copy_prompt(rng, n)[0] for n in (50, 400, 1000)]
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
