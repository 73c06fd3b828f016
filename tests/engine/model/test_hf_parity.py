"""Greedy output identical, token for token, to HF transformers generate()."""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.core import Engine
from engine.model.load import load_model
from engine.request import SamplingParams
from tests.hf_checkpoints import ARCH_CASES, hf_greedy, write_random_checkpoint

PROMPT_LENGTHS = [1, 2, 7, 16, 17, 33, 64, 130, 300]
NEW_TOKENS = 12


def _config(model_dir, **engine) -> EngineConfig:
    return EngineConfig().replace(model={"path": str(model_dir), "dtype": "float32", "device": "cpu"},
                                  engine={"max_batch": 16, **engine})


def _prompts(seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 300, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]


@pytest.mark.parametrize("case", sorted(ARCH_CASES))
def test_mixed_length_batch_matches_hf_generate(case, checkpoint_dirs):
    model_dir = checkpoint_dirs[case]
    prompts = _prompts(seed=len(case))
    engine = Engine(_config(model_dir))
    # Every prompt is in flight at once: one prefill step, then one mixed-length decode batch.
    requests = engine.generate(prompts, SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True))
    assert engine.counters.steps == NEW_TOKENS
    expected = hf_greedy(model_dir, prompts, NEW_TOKENS)
    for prompt, request, want in zip(prompts, requests, expected):
        assert request.output_ids == want, f"{case}: prompt of {len(prompt)} tokens diverged"


def test_sharded_checkpoint_loads_the_same_weights(tmp_path, checkpoint_dirs):
    sharded = write_random_checkpoint(tmp_path / "sharded", max_shard_size="60KB", **ARCH_CASES["llama-gqa"])
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("*.safetensors"))) > 1
    single = load_model(checkpoint_dirs["llama-gqa"], device="cpu").decoder.state_dict()
    shards = load_model(sharded, device="cpu").decoder.state_dict()
    assert single.keys() == shards.keys()
    for name in single:
        assert torch.equal(single[name], shards[name]), name


def test_default_model_matches_hf_generate():
    from engine.config import DEFAULT_MODEL_DIR

    prompts = [[256, *range(70, 70 + n)] for n in (0, 5, 40)]
    engine = Engine(_config(DEFAULT_MODEL_DIR))
    requests = engine.generate(prompts, SamplingParams(max_new_tokens=16, ignore_eos=True))
    assert [r.output_ids for r in requests] == hf_greedy(DEFAULT_MODEL_DIR, prompts, 16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_loads_and_generates(dtype, checkpoint_dirs):
    name = str(dtype).removeprefix("torch.")
    model = load_model(checkpoint_dirs["qwen2-gqa"], dtype=name, device="cpu")
    assert all(p.dtype == dtype for p in model.decoder.parameters())
    config = _config(checkpoint_dirs["qwen2-gqa"], context_window=512).replace(model={"dtype": name})
    engine = Engine(config, model)
    assert engine.pool.data.dtype == dtype
    (request,) = engine.generate([[1, 2, 3, 4, 5]], SamplingParams(max_new_tokens=4, ignore_eos=True))
    assert len(request.output_ids) == 4
    assert all(0 <= t < 300 for t in request.output_ids)
