"""The pure parts of bench/vs_vllm.py and bench/make_random_llama.py: statistics, SSE parsing,
latency arithmetic, the table, prompts, and the checkpoint writer at a tiny size. No servers."""

from __future__ import annotations

import importlib.util
import json
import math
import sys

import pytest

from engine.config import REPO_ROOT


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


vs = _load("vs_vllm")
mk = _load("make_random_llama")


# ---- statistics ---------------------------------------------------------------------------

def test_percentile_interpolates_like_numpy():
    xs = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert vs.percentile(xs, 50) == 3.0
    assert vs.percentile(xs, 0) == 1.0 and vs.percentile(xs, 100) == 5.0
    assert vs.percentile(xs, 99) == pytest.approx(4.96)
    assert vs.percentile([1.0, 2.0], 50) == 1.5
    assert vs.percentile([7.0], 99) == 7.0
    assert math.isnan(vs.percentile([], 50))


def test_median_and_best():
    assert vs.med_best([3.0, 1.0, 2.0, 10.0]) == (2.5, 10.0)
    assert all(math.isnan(x) for x in vs.med_best([]))


# ---- SSE parsing ----------------------------------------------------------------------------

def _sse(t, text=None, *, usage=None, ids=None, finish=None, choices=True):
    msg = {"object": "text_completion"}
    if choices:
        choice = {"index": 0, "text": text or "", "finish_reason": finish}
        if ids is not None:
            choice["token_ids"] = ids
        msg["choices"] = [choice]
    else:
        msg["choices"] = []
    if usage is not None:
        msg["usage"] = {"prompt_tokens": 4, "completion_tokens": usage, "total_tokens": 4 + usage}
    return (t, json.dumps(msg))


def test_parse_stream_counts_tokens_from_cumulative_usage():
    # vLLM with continuous_usage_stats: the second chunk carries two tokens, the finish chunk none
    events = [_sse(1.0, "a", usage=1), _sse(1.5, "bc", usage=3), _sse(2.0, "d", usage=4),
              _sse(2.1, "", usage=4, finish="length"), _sse(2.2, usage=4, choices=False)]
    got = vs.parse_stream(events)
    assert got["text"] == "abcd" and got["completion_tokens"] == 4 and got["finish_reason"] == "length"
    assert [(c.t, c.text, c.n_tokens) for c in got["chunks"]] == [(1.0, "a", 1), (1.5, "bc", 2), (2.0, "d", 1)]
    assert got["token_ids"] is None


def test_parse_stream_prefers_token_ids_and_keeps_them():
    events = [_sse(1.0, "x", ids=[7], usage=1), _sse(1.2, "yz", ids=[8, 9], usage=3),
              _sse(1.3, "", ids=[], finish="length", usage=3)]
    got = vs.parse_stream(events)
    assert got["token_ids"] == [7, 8, 9]
    assert [c.n_tokens for c in got["chunks"]] == [1, 2]


def test_parse_stream_without_per_chunk_counts():
    # ours: text chunks, then the finish chunk and one usage-only chunk at the end
    events = [_sse(1.0, "a"), _sse(1.1, "b"), _sse(1.3, "", finish="length"), _sse(1.3, usage=2, choices=False)]
    got = vs.parse_stream(events)
    assert got["completion_tokens"] == 2
    assert [c.n_tokens for c in got["chunks"]] == [None, None]


def test_parse_stream_raises_on_an_error_chunk():
    with pytest.raises(vs.BenchError, match="boom"):
        vs.parse_stream([_sse(1.0, "a"), (1.1, json.dumps({"error": {"message": "boom"}}))])


# ---- latency --------------------------------------------------------------------------------

def test_chunk_token_counts():
    C = vs.Chunk
    assert vs.chunk_token_counts([C(0, "a", 1), C(1, "bc", 2)], 3) == ([1, 2], True)
    assert vs.chunk_token_counts([C(0, "a", None), C(1, "b", None)], 2) == ([1, 1], True)
    # fewer chunks than tokens, nothing said: spread evenly, the remainder on the last chunks
    assert vs.chunk_token_counts([C(0, "a", None), C(1, "b", None), C(2, "c", None)], 5) == ([1, 2, 2], False)
    assert vs.chunk_token_counts([], 0) == ([], True)


def test_stream_latency_divides_a_chunk_delay_among_its_tokens():
    chunks = [vs.Chunk(10.5, "a", 1), vs.Chunk(10.7, "bc", 2), vs.Chunk(10.8, "d", 1)]
    reply = vs.Reply(sent=10.0, done=10.9, completion_tokens=4, text="abcd", chunks=chunks)
    lat = vs.stream_latency(reply)
    assert lat["ttft"] == pytest.approx(0.5)
    assert lat["itl"] == pytest.approx([0.1, 0.1, 0.1])  # 0.2 s over 2 tokens, then 0.1 s over 1
    assert lat["tpot"] == pytest.approx(0.3 / 3)
    assert lat["exact"] is True


def test_batch_throughput_is_tokens_over_first_send_to_last_answer():
    replies = [vs.Reply(sent=1.0, done=2.0, completion_tokens=10, text=""),
               vs.Reply(sent=1.1, done=3.0, completion_tokens=30, text="")]
    assert vs.batch_throughput(1.0, replies) == pytest.approx(40 / 2.0)


def test_summarize_case_pools_latencies_and_converts_to_ms():
    lat = [{"ttft": 0.010, "itl": [0.001, 0.003], "tpot": 0.002, "exact": True}]
    batches = [{"tok_s": 100.0, "latency": lat}, {"tok_s": 300.0, "latency": lat}, {"tok_s": 200.0}]
    got = vs.summarize_case(batches)
    assert got["median"] == 200.0 and got["best"] == 300.0
    assert got["ttft_50"] == pytest.approx(10.0) and got["itl_50"] == pytest.approx(2.0)
    assert got["tpot_99"] == pytest.approx(2.0) and got["exact_chunks"] is True
    assert "ttft_50" not in vs.summarize_case([{"tok_s": 1.0}])


# ---- identical outputs ------------------------------------------------------------------------

def test_first_difference_and_compare():
    assert vs.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert vs.first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert vs.first_difference([1, 2], [1, 2, 3]) == 2
    assert vs.first_difference("abc", "abd") == 2
    got = vs.compare_outputs([[1, 2], [3, 4], [5]], [[1, 2], [3, 9], [6]])
    assert got == {"n": 3, "match": 1, "diffs": [[1, 1], [2, 0]]}
    with pytest.raises(ValueError):
        vs.compare_outputs([[1]], [])


def test_identical_outputs_falls_back_to_text_without_ids():
    ours = {"outputs": {"token_ids": [[1, 2]], "text": ["ab"]}}
    with_ids = {"outputs": {"token_ids": [[1, 3]], "text": ["ab"]}}
    without = {"outputs": {"token_ids": [None], "text": ["ab"]}}
    assert vs.identical_outputs(with_ids, ours)["by"] == "token ids"
    assert vs.identical_outputs(with_ids, ours)["match"] == 0
    assert vs.identical_outputs(without, ours) == {"by": "text", "n": 1, "match": 1, "diffs": []}


# ---- the table --------------------------------------------------------------------------------

def test_format_table():
    v = {"c=1 stream": {"median": 100.0, "best": 110.0, "ttft_50": 10.0, "ttft_99": 12.0, "itl_50": 2.0,
                        "itl_99": 3.0, "tpot_50": 2.0, "tpot_99": 2.5, "exact_chunks": True},
         "c=1 whole": {"median": 200.0, "best": 210.0}}
    o = {"c=1 stream": {"median": 50.0, "best": 60.0, "ttft_50": 20.0, "ttft_99": 30.0, "itl_50": 4.0,
                        "itl_99": 5.0, "tpot_50": 0.0, "tpot_99": 1.0, "exact_chunks": False},
         "c=1 whole": {"median": 300.0, "best": 1234.5}}
    text = vs.format_table("T", ["c=1 stream", "c=1 whole"], {"vllm": v, "ours": o},
                           {"by": "token ids", "n": 4, "match": 3, "diffs": [[2, 17]]})
    lines = text.splitlines()
    assert lines[0] == "T"
    row = next(line for line in lines if line.startswith("c=1 stream "))
    assert "100.0 / 110.0" in row and "50.0 / 60.0" in row and row.endswith("0.50x")
    row = next(line for line in lines if line.startswith("c=1 whole "))
    assert "1,234.5" in row and row.endswith("1.50x")
    assert next(line for line in lines if line.startswith("c=1 TTFT")).endswith("2.00x")
    assert "(approx: ours)" in next(line for line in lines if line.startswith("c=1 ITL"))
    assert lines[-1] == "identical outputs (token ids): 3/4; first differing position: #2 at 17"


def test_format_table_with_one_server_only():
    text = vs.format_table("T", ["c=1 whole"], {"ours": {"c=1 whole": {"median": 5.0, "best": 6.0}}}, None)
    row = text.splitlines()[2]
    assert row.split()[2] == "-" and "5.0 / 6.0" in row and row.endswith("-")


def test_ratio_ignores_near_zero_denominators():
    assert vs._ratio(2.0, 0.01, 0.05) == "-"
    assert vs._ratio(2.0, 1.0, 0.05) == "2.00x"
    assert vs._ratio(math.nan, 1.0) == "-"


# ---- prompts, requests, sizes -----------------------------------------------------------------

def test_prompts_are_seeded_in_range_and_skip_excluded_ids():
    a = vs.make_prompts(8, 64, 0, 20, exclude=(0, 1, 2), seed=3)
    assert a == vs.make_prompts(8, 64, 0, 20, exclude=(0, 1, 2), seed=3)
    assert a != vs.make_prompts(8, 64, 0, 20, exclude=(0, 1, 2), seed=4)
    assert len(a) == 8 and all(len(p) == 64 for p in a)
    flat = {t for p in a for t in p}
    assert flat <= set(range(3, 20)) and len(flat) > 10
    with pytest.raises(ValueError):
        vs.make_prompts(1, 1, 0, 2, exclude=(0, 1))


def test_special_ids_of_the_copy_checkpoint():
    assert vs.special_ids(REPO_ROOT / "resources" / "models" / "pagewarden-copy") == (256, 257, 258)


def test_request_body():
    body = vs.request_body("m", [1, 2], 8, True)
    assert body["prompt"] == [1, 2] and body["max_tokens"] == 8 and body["temperature"] == 0
    assert body["ignore_eos"] is True and body["stream_options"]["include_usage"] is True
    assert "stream_options" not in vs.request_body("m", [1], 8, False)


def test_pool_sizes_hold_the_largest_batch():
    assert vs.vllm_blocks(64, 64, 128) * vs.VLLM_BLOCK >= 64 * 192
    assert vs.our_pages(64, 64, 128) * vs.OUR_PAGE >= 64 * 192


def test_quick_and_default_arguments():
    quick = vs.parse_args(["--quick"])
    assert (quick.reps, quick.concurrency, quick.new_tokens) == (1, [1, 16], 32)
    full = vs.parse_args([])
    assert (full.reps, full.concurrency, full.new_tokens, full.prompt) == (5, [1, 16, 64], 128, 64)
    assert full.model == ["copy", "llama135m"]
    assert vs.parse_args(["--quick", "--reps", "3"]).reps == 3


# ---- the checkpoint writer --------------------------------------------------------------------

def test_synthetic_words_are_distinct():
    words = [mk.word(i) for i in range(5000)]
    assert len(set(words)) == len(words)
    assert all(w.isalpha() and w.islower() for w in words)
    vocab = mk.vocabulary(300)
    assert len(vocab) == 300 and sorted(vocab.values()) == list(range(300))
    assert vocab["<s>"] == 1 and vocab["</s>"] == 2


TINY = {"vocab_size": 300, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 128}


def test_tiny_checkpoint_loads_in_our_engine_and_is_idempotent(tmp_path):
    from safetensors.torch import load_file

    from engine.model.load import load_model

    out = tmp_path / "m"
    assert mk.write_checkpoint(out, seed=1, overrides=TINY) is True
    assert mk.write_checkpoint(out, seed=1, overrides=TINY) is False  # already there
    first = load_file(str(out / "model.safetensors"))
    assert mk.write_checkpoint(out, seed=1, overrides=TINY, force=True) is True
    again = load_file(str(out / "model.safetensors"))
    assert first.keys() == again.keys() and all((first[k] == again[k]).all() for k in first)
    assert "lm_head.weight" in first  # untied
    assert mk.write_checkpoint(out, seed=2, overrides=TINY) is True  # another seed: rewritten
    assert not (load_file(str(out / "model.safetensors"))["lm_head.weight"] == first["lm_head.weight"]).all()

    model = load_model(out, device="cpu")
    assert model.config.vocab_size == 300 and model.config.num_kv_heads == 2
    assert model.config.architecture == "LlamaForCausalLM" and not model.config.tie_word_embeddings
    tok = model.tokenizer
    assert tok.vocab_size == 300
    ids = tok.encode(f"{mk.word(10)} {mk.word(11)}")
    assert ids == [1, 10, 11]  # BOS, then one id per word
    assert tok.decode([10, 11, 2]) == f"{mk.word(10)} {mk.word(11)}"
    assert vs.special_ids(out) == (0, 1, 2)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["num_attention_heads"] == 4 and cfg["architectures"] == ["LlamaForCausalLM"]


def test_tiny_checkpoint_greedy_output_is_not_one_token(tmp_path):
    out = tmp_path / "m"
    mk.write_checkpoint(out, seed=1, overrides={**TINY, "num_hidden_layers": 4})
    for ids in mk.greedy_check(out, prompts=2, prompt_len=8, new=16):
        assert len(set(ids)) > 4, ids


def test_the_135m_shape():
    cfg = mk.CONFIG
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["head_dim"], cfg["intermediate_size"], cfg["vocab_size"]) == (576, 30, 9, 3, 64, 1536, 49152)
    assert vs.CHECKPOINTS["llama135m"][0] == mk.DEFAULT_OUT


def test_shape_overrides_take_integer_fields_and_name_what_is_wrong():
    assert mk.shape_overrides(["hidden_size=192", "num_hidden_layers=8"]) == {"hidden_size": 192,
                                                                              "num_hidden_layers": 8}
    with pytest.raises(ValueError, match="'hidden' is not an integer field of the config"):
        mk.shape_overrides(["hidden=192"])
    with pytest.raises(ValueError, match="'model_type' is not an integer field"):
        mk.shape_overrides(["model_type=7"])
    with pytest.raises(ValueError, match="'x' is not an integer"):
        mk.shape_overrides(["hidden_size=x"])
    with pytest.raises(ValueError, match="must be at least 1"):
        mk.shape_overrides(["num_hidden_layers=0"])


def test_a_checkpoint_directory_is_a_model_and_anything_else_is_named(tmp_path):
    mk.write_checkpoint(tmp_path / "m", seed=1, overrides=TINY)
    assert vs.checkpoint(str(tmp_path / "m")) == (tmp_path / "m", (0, 300))
    assert vs.checkpoint("copy") == vs.CHECKPOINTS["copy"]
    with pytest.raises(vs.BenchError, match="'nowhere' is neither one of copy, llama135m nor a checkpoint"):
        vs.checkpoint("nowhere")
