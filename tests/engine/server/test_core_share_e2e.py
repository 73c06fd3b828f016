"""Shared cores, served: the workers of a model whose projection weights total SHARE_MIN_BYTES
or more take every core while computing alone (engine/workers/core_share.py); the default copy
model's workers keep a fixed part each (test_control_e2e), because served its 1 ms step gained
nothing from a second thread."""

from __future__ import annotations

import os

import pytest

from engine.workers.core_share import SHARE_MIN_BYTES
from tests.hf_checkpoints import write_random_checkpoint

pytestmark = pytest.mark.e2e


def test_the_workers_of_a_model_with_a_large_projection_share_every_core(start_server, tmp_path):
    vocab = SHARE_MIN_BYTES // (64 * 4)  # an untied lm_head of exactly SHARE_MIN_BYTES (hidden 64, float32)
    model = write_random_checkpoint(tmp_path / "wide-vocab", arch="llama", num_attention_heads=4,
                                    num_key_value_heads=2, tie_word_embeddings=False, vocab_size=vocab)
    server = start_server(model={"path": str(model), "dtype": "float32"})
    client = server.client()
    cores = len(os.sched_getaffinity(0))
    assert [(w["threads"], w["threads_shared"]) for w in client.status()["workers"]] == [(cores, True)] * 2
    done = client.generate([5, 6, 7, 8], max_new_tokens=6, ignore_eos=True)
    assert len(done["token_ids"]) == 6
    server.check_alive()
