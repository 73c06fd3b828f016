"""Pages larger than ZeroMQ's copy threshold (64 KiB) through the real served path.

The prefill worker sends a request's pages as views of its pool without copying them and
frees them once ZeroMQ is done with them. It used to ask pyzmq's send_multipart for that,
whose tracker covers only the last (small, copied) frame: the pages were scrubbed while
ZeroMQ's I/O thread still read them, and every request of a checkpoint with pages over
64 KiB (a 135M-class model: 737 KB) failed its transfer checksum. The tiny default model's
pages (8 KiB) are always copied, which is why nothing showed it before."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from engine.config import EngineConfig
from engine.core import Engine
from engine.model.load import load_model
from engine.request import SamplingParams
from resources.models.make_tiny_random import write_model

pytestmark = pytest.mark.e2e

# 4 layers x (K, V) x 16 slots x 8 KV heads x 128 dims x 4 bytes = 512 KiB per page
BIG_PAGES = {"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 128,
             "hidden_size": 128, "intermediate_size": 128}
PAGE_BYTES = 4 * 2 * 16 * 8 * 128 * 4


@pytest.fixture(scope="module")
def big_page_model(tmp_path_factory):
    out = tmp_path_factory.mktemp("big-pages") / "model"
    write_model(out, seed=11, config=BIG_PAGES)
    return out


def test_requests_with_pages_over_the_copy_threshold_are_served_exactly(big_page_model, start_server):
    prompts = [[(7 * i + j) % 250 + 1 for j in range(40 + 9 * i)] for i in range(6)]
    config = EngineConfig().replace(model={"path": str(big_page_model), "device": "cpu", "dtype": "float32"},
                                    engine={"kernels": "torch"}, canaries={"enabled": False},
                                    pools={"prefill": {"pages": 64}, "decode": {"pages": 64}})
    engine = Engine(config, load_model(big_page_model, dtype="float32", device="cpu"))
    assert engine.pool.layout.bytes_per_page == PAGE_BYTES > 64 * 1024
    want = [r.output_ids for r in engine.generate(prompts, SamplingParams(max_new_tokens=8, ignore_eos=True))]

    server = start_server(model={"path": str(big_page_model), "dtype": "float32"}, canaries={"enabled": False},
                          pools={"prefill": {"pages": 64}, "decode": {"pages": 64}})

    def one(ids):
        with server.client() as client:
            return client.generate(ids, max_new_tokens=8, ignore_eos=True, temperature=0.0)["token_ids"]

    with ThreadPoolExecutor(3) as pool:
        got = list(pool.map(one, prompts))
    assert got == want
    status = server.client().status()
    assert status["counters"].get("transfers_rejected", 0) == 0, status["counters"]
