"""Weights in oneDNN's packed layout (engine/model/cpu_linear.py): same results as nn.Linear
up to float32 rounding, the same greedy tokens as HF generate(), and only where it pays."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from engine.config import EngineConfig
from engine.core import Engine
from engine.errors import ConfigError
from engine.model.cpu_linear import PACK_MIN_BYTES, PackedLinear, pack_linears, packing_available
from engine.model.load import load_model
from engine.request import SamplingParams
from tests.hf_checkpoints import hf_greedy

pytestmark = pytest.mark.skipif(not packing_available(), reason="this torch has no oneDNN")


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [0, 1, 5, 64])
def test_packed_linear_matches_nn_linear(bias, rows):
    torch.manual_seed(rows)
    linear = nn.Linear(576, 960, bias=bias)
    packed = PackedLinear(linear)
    x = torch.randn(rows, 576)
    with torch.inference_mode():
        want, got = linear(x), packed(x)
    assert got.shape == (rows, 960) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_packed_linear_takes_strided_and_batched_input():
    linear = nn.Linear(64, 96)
    packed = PackedLinear(linear)
    wide = torch.randn(3, 128)
    with torch.inference_mode():
        torch.testing.assert_close(packed(wide[:, ::2]), linear(wide[:, ::2]), rtol=1e-4, atol=1e-4)
        x = torch.randn(2, 3, 64)
        torch.testing.assert_close(packed(x), linear(x), rtol=1e-4, atol=1e-4)


def test_only_large_float32_cpu_weights_are_packed():
    small = nn.Linear(64, 64)  # 16 KiB: stays in cache, plain is faster
    large = nn.Linear(512, 1024)  # 2 MiB
    half = nn.Linear(1024, 1024).to(torch.bfloat16)  # not measured: left alone
    model = nn.Sequential(small, nn.Sequential(large), half)
    assert pack_linears(model) == 1
    assert model[0] is small and model[2] is half
    assert isinstance(model[1][0], PackedLinear)
    assert large.weight.numel() * 4 >= PACK_MIN_BYTES > small.weight.numel() * 4


def test_tied_lm_head_gets_its_own_copy_and_the_embedding_keeps_the_original(checkpoint_dirs):
    model = load_model(checkpoint_dirs["llama-mha-tied"], dtype="float32", device="cpu", cpu_weight_layout="plain")
    embedding = model.decoder.model.embed_tokens.weight
    before = embedding.clone()
    assert model.decoder.lm_head.weight is embedding
    assert pack_linears(model.decoder, min_bytes=0) == 4 * 2 + 1  # qkv, o, gate_up, down in 2 layers + lm_head
    assert isinstance(model.decoder.lm_head, PackedLinear)
    assert model.decoder.model.embed_tokens.weight is embedding and torch.equal(embedding, before)


def test_the_default_model_is_left_plain():
    """The embedded model's weights are all under 1 MiB: packing them would only add
    oneDNN's per-call cost."""
    model = load_model(EngineConfig().model.resolved_path(), dtype="float32", device="cpu")
    assert not any(isinstance(m, PackedLinear) for m in model.decoder.modules())


@pytest.mark.parametrize("case", ["llama-gqa", "llama-bias", "qwen2-gqa"])
def test_engine_on_packed_weights_matches_hf_generate(case, checkpoint_dirs):
    """Every projection packed (threshold 0), served through the paged engine: the greedy
    tokens are HF's, token for token."""
    model_dir = checkpoint_dirs[case]
    model = load_model(model_dir, dtype="float32", device="cpu", cpu_weight_layout="plain")
    assert pack_linears(model.decoder, min_bytes=0) == 9
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 300, (n,), generator=gen).tolist() for n in (1, 7, 17, 64, 130)]
    config = EngineConfig().replace(model={"path": str(model_dir), "dtype": "float32", "device": "cpu"},
                                    engine={"max_batch": 16, "kernels": "torch", "context_window": 512})
    requests = Engine(config, model).generate(prompts, SamplingParams(max_new_tokens=12, ignore_eos=True))
    assert [r.output_ids for r in requests] == hf_greedy(model_dir, prompts, 12)


def test_packed_logits_stay_within_float32_rounding_of_plain(checkpoint_dirs):
    model_dir = checkpoint_dirs["llama-gqa"]
    plain = load_model(model_dir, dtype="float32", device="cpu", cpu_weight_layout="plain")
    packed = load_model(model_dir, dtype="float32", device="cpu", cpu_weight_layout="plain")
    pack_linears(packed.decoder, min_bytes=0)
    from engine.dense_reference import dense_greedy

    tokens_plain, logits_plain = dense_greedy(plain.decoder, [5, 9, 200, 17], 6)
    tokens_packed, logits_packed = dense_greedy(packed.decoder, [5, 9, 200, 17], 6)
    assert tokens_packed == tokens_plain
    for a, b in zip(logits_packed, logits_plain):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert any(not torch.equal(a, b) for a, b in zip(logits_packed, logits_plain)), "packing took no effect"


def test_unknown_layout_is_refused_with_the_choices(tmp_path):
    with pytest.raises(ConfigError, match=r"cpu_weight_layout 'blocked' is not one of packed, plain"):
        load_model(EngineConfig().model.resolved_path(), device="cpu", cpu_weight_layout="blocked")
    toml = tmp_path / "engine.toml"
    toml.write_text('[model]\ncpu_weight_layout = "blocked"\n')
    from engine.config import load_config

    with pytest.raises(ConfigError, match=r"model.cpu_weight_layout = 'blocked' is not one of packed, plain"):
        load_config(toml)
