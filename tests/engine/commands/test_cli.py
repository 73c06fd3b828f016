"""The command line: JSON contract, exit codes, help on every command, clear errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import main
from engine.config import DEFAULT_CONFIG_PATH, REPO_ROOT

INCIDENT = str(DEFAULT_CONFIG_PATH.parent / "incident.toml")


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "main.py", *argv], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=300)


def test_generate_json_from_a_real_process_matches_the_engine(make_engine):
    proc = _run("generate", "--prompt-ids", "256,72,105,33", "--max-new-tokens", "9", "--ignore-eos", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    engine = make_engine()
    from engine.request import SamplingParams

    (request,) = engine.generate([[256, 72, 105, 33]], SamplingParams(max_new_tokens=9, ignore_eos=True))
    assert result["token_ids"] == request.output_ids
    assert result["prompt_ids"] == [256, 72, 105, 33] and result["finish_reason"] == "length"
    assert isinstance(result["text"], str)


def test_generate_text_prompt_uses_the_tokenizer(capsys):
    assert main.main(["generate", "--prompt", "Hi!", "--max-new-tokens", "3", "--ignore-eos", "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["prompt_ids"] == [256, 72, 105, 33] and len(result["token_ids"]) == 3


def test_capacity_incident_exits_1_with_the_numbers_in_one_line():
    proc = _run("capacity", "--config", INCIDENT)
    assert proc.returncode == 1
    (line,) = [l for l in proc.stdout.splitlines() if "prefill pool" in l]
    assert "exceeds the prefill pool" in line and "367,296 tokens" in line and "65.0%" in line


def test_capacity_default_passes_and_json_is_complete(capsys):
    assert main.main(["capacity"]) == 0
    capsys.readouterr()
    assert main.main(["capacity", "--config", INCIDENT, "--json"]) == 1
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    prefill = next(f for f in report["findings"] if f["limit"] == "pool:prefill")
    assert report["exceeds"] and prefill["shortfall_tokens"] == 367_296 and prefill["coverage"] == pytest.approx(0.6497, abs=1e-4)


@pytest.mark.parametrize("argv", [["--help"], ["generate", "--help"], ["capacity", "--help"], ["gui", "--help"],
                                  ["serve", "--help"], ["status", "--help"], ["workers", "--help"],
                                  ["submit", "--help"], ["keys", "--help"], ["keys", "generate", "--help"]])
def test_help_on_every_command(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main.main(argv)
    assert exit_.value.code == 0
    assert "usage: python main.py" in capsys.readouterr().out


def test_no_command_means_the_desktop_app_hosting_an_engine():
    args = main.parse([])
    assert args.command == "gui" and args.func is main.cmd_gui
    assert args.attach is None and not args.readonly  # hosts a local engine


@pytest.mark.parametrize(
    "argv, code, fragment",
    [
        (["generate", "--prompt-ids", "1,two"], 2, "--prompt-ids: item 1 = 'two' is not an integer token id"),
        (["generate", "--prompt-ids", "1,999"], 2, "prompt token 1 = 999 is outside the vocabulary 0..271"),
        (["generate", "--prompt-ids", "1", "--max-new-tokens", "0"], 2, "max_new_tokens = 0 must be at least 1"),
        (["generate", "--prompt-ids", "1,2", "--max-new-tokens", "4000"], 1,
         "needs 4,002 tokens (prompt 2 + max_new_tokens 4,000) but the context window is 2,048 tokens"),
        (["generate", "--prompt", "x", "--model", "/no/such/model"], 2, "model directory not found: /no/such/model"),
        (["generate", "--prompt", "x", "--config", "/no/such.toml"], 2, "config file not found: /no/such.toml"),
        (["capacity", "--config", "/no/such.toml"], 2, "config file not found"),
    ],
)
def test_bad_input_gets_a_clear_error(argv, code, fragment, capsys):
    assert main.main([*argv, "--json"]) == code
    captured = capsys.readouterr()
    assert fragment in captured.err
    assert fragment in json.loads(captured.out.strip().splitlines()[-1])["error"]["message"]


def test_generate_with_a_pool_larger_than_memory_names_pages_and_memory(tmp_path, capsys):
    """pools.decode.pages = 2**31 - 1 ended in torch's RuntimeError traceback (70 TB asked for)."""
    from engine.client.local_server import write_config

    config = write_config(tmp_path / "big.toml", pools={"prefill": {"pages": 16}, "decode": {"pages": (1 << 31) - 1}})
    assert main.main(["generate", "--prompt-ids", "256,1", "--config", str(config), "--json"]) == 2
    message = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["error"]["message"]
    assert "pools.decode.pages = 2,147,483,647 needs" in message and "GiB of memory; make the pool smaller" in message
