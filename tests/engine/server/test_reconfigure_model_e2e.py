"""Issue 14, item 6: `reconfigure({"model": {"path": "/nonexistent"}}, apply=True)` answered
valid and applied, every worker then crashed and the engine was down. Now what can be checked
is checked before applying, and an apply whose workers cannot start with it is rolled back."""

from __future__ import annotations

import json
import shutil
import time

import pytest

from engine.client import RemoteError
from engine.config import TINY_RANDOM_MODEL_DIR

pytestmark = pytest.mark.e2e  # real engine processes

PROMPT = [256, 40, 41, 42]


def _kinds(client) -> list[str]:
    return [a["kind"] for a in client.status()["alerts"]]


@pytest.mark.parametrize("path, reason", [
    ("/nonexistent", "model directory not found: /nonexistent"),
    ("EMPTY", "missing file"),
])
def test_a_model_that_cannot_load_is_refused_before_anything_changes(start_server, tmp_path, path, reason):
    server = start_server()
    client = server.client()
    before = client.generate(PROMPT, max_new_tokens=4, ignore_eos=True)["token_ids"]
    if path == "EMPTY":
        (tmp_path / "empty").mkdir()
        path = str(tmp_path / "empty")
    with pytest.raises(RemoteError) as err:
        client.reconfigure({"model": {"path": path}}, apply=True)
    assert err.value.code == "config_error" and reason in str(err.value)
    assert f"model.path = {path!r}" in str(err.value)
    status = client.status()
    assert status["config"]["model"]["path"] == "" and all(w["state"] == "ready" for w in status["workers"])
    assert client.generate(PROMPT, max_new_tokens=4, ignore_eos=True)["token_ids"] == before


def test_an_apply_whose_workers_crash_is_rolled_back_with_an_alert(start_server, tmp_path):
    # passes every check a supervisor can make without loading it (config, architecture,
    # safetensors headers); its tensors do not match its config, which only loading finds
    broken = tmp_path / "broken-model"
    shutil.copytree(TINY_RANDOM_MODEL_DIR, broken)
    cfg = json.loads((broken / "config.json").read_text())
    cfg["intermediate_size"] *= 2
    (broken / "config.json").write_text(json.dumps(cfg))
    server = start_server(model={"path": str(TINY_RANDOM_MODEL_DIR)}, workers={"restart_backoff_ms": 200})
    client = server.client()
    before = client.generate(PROMPT, max_new_tokens=4, ignore_eos=True)["token_ids"]
    result = client.reconfigure({"model": {"path": str(broken)}}, apply=True)
    assert result["applied"] and set(result["restart"]) == {"prefill-0", "decode-0"}
    for _ in range(600):
        if "reconfigure_rolled_back" in _kinds(client):
            break
        time.sleep(0.2)
    (alert,) = [a for a in client.status()["alerts"] if a["kind"] == "reconfigure_rolled_back"]
    assert "crashed while starting with the new configuration" in alert["detail"]
    status = server.wait_workers(client)
    assert status["config"]["model"]["path"] == str(TINY_RANDOM_MODEL_DIR)
    assert client.generate(PROMPT, max_new_tokens=4, ignore_eos=True)["token_ids"] == before
