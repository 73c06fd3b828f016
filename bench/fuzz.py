"""Fuzz every parser that takes outside input for minutes, and count.

    python bench/fuzz.py [--seconds 60] [--targets control,http-body,...] [--out DIR] [--seed N]

Each target (tests/fuzz/parsers.py) may only return or raise its documented error. Inputs are
mutations (bit flips, byte insertions and deletions, splices, repeats, nesting) of a small
corpus of valid inputs: a control message, KV-event frames (live, replayed, and applied to a
bounded block state), a completion body, the shipped config, the default model's config.json,
a snapshot's JSON, and a real snapshot bundle with
its inner members (events.jsonl, pages.npz, its .npy arrays). Anything else raised is a
finding: its input is written to --out and it is counted by exception type and first line.
Exit status 1 when anything was found.

    python bench/fuzz.py --atheris [--seconds 60] [--targets ...]   # coverage-guided

runs each target under atheris (libFuzzer for Python, `pip install atheris`; a bench-only
tool, not a project dependency) in its own process, seeded with the same corpus, and reports
its executions and whether it found a crash (the input is saved under --out).
"""

from __future__ import annotations

import argparse
import atexit
import collections
import json
import random
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import msgpack  # noqa: E402

from engine.config import DEFAULT_CONFIG_PATH, DEFAULT_MODEL_DIR  # noqa: E402
from engine.wire.protocol import pack  # noqa: E402
from tests.fuzz.kv_event_parsers import corpus as kv_corpus  # noqa: E402
from tests.fuzz.parsers import TARGETS  # noqa: E402
from tests.fuzz.template_parsers import close as close_render_processes  # noqa: E402

atexit.register(close_render_processes)


def corpus() -> dict[str, list[bytes]]:
    submit = b"".join(bytes(f) for f in pack({"op": "submit", "id": 3, "prompt_ids": [256, 1, 2], "max_new_tokens": 4,
                                              "params": {"temperature": 0.5}}))
    kv = (0).to_bytes(8, "big") + msgpack.packb(
        [1.7e9, [["BlockStored", [123, 456], None, [1, 2, 3, 4], 16, None, "GPU"], ["BlockRemoved", [123], "GPU"]],
         None])
    config_json = (DEFAULT_MODEL_DIR / "config.json").read_bytes()
    body = b'{"prompt": "Repeat: abc", "max_tokens": 8, "temperature": 0, "stop": ["\\n"], "stream": false}'
    return {"control": [submit], "control-msgpack": [submit], "kv-events": [kv], "http-body": [body],
            "toml-config": [DEFAULT_CONFIG_PATH.read_bytes()], "config-json": [config_json],
            "snapshot": [b'"a": 1', b'{"requests": [{"request_id": "r1", "phase": "queued"}], "alerts": []}'],
            **bundle_corpus(), **kv_corpus(), "chat-template": template_corpus()}


def template_corpus() -> list[bytes]:
    """The default model's own chat template (where it has one) and two of the usual shapes."""
    config = json.loads((DEFAULT_MODEL_DIR / "tokenizer_config.json").read_text()) \
        if (DEFAULT_MODEL_DIR / "tokenizer_config.json").is_file() else {}
    own = config.get("chat_template") if isinstance(config.get("chat_template"), str) else None
    usual = ["{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
             "{% if add_generation_prompt %}<|assistant|>{% endif %}",
             "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content }} [/INST]"
             "{% else %}{{ m.content }}{{ eos_token }}{% endif %}{% endfor %}"]
    return [t.encode() for t in ([own] if own else []) + usual]


def bundle_corpus() -> dict[str, list[bytes]]:
    """A real bundle (deflated, and stored so that mutations reach its contents), its events.jsonl,
    its pages.npz (compressed, and stored so that mutations reach the .npy headers), and .npy
    members of format 1.0 and 2.0."""
    import io
    import zipfile

    import numpy as np

    from tests.fuzz.parsers import seed_bundle

    with zipfile.ZipFile(io.BytesIO(seed_bundle())) as zf:
        events, npz = zf.read("events.jsonl"), zf.read("pages.npz")
    with np.load(io.BytesIO(npz)) as arrays:
        stored = io.BytesIO()
        np.savez(stored, **{key: arrays[key] for key in arrays.files})
    npy = []
    for array, version in ((np.arange(8, dtype=np.int32), (1, 0)), (np.full(4, -1, np.int64), (2, 0))):
        out = io.BytesIO()
        np.lib.format.write_array(out, array, version=version)
        npy.append(out.getvalue())
    return {"snapshot-zip": [seed_bundle(), seed_bundle(stored=True)], "snapshot-jsonl": [events],
            "snapshot-npz": [npz, stored.getvalue()], "snapshot-npy": npy}


def mutate(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        op = rng.randrange(7)
        i = rng.randrange(len(b) + 1)
        if op == 0 and b:
            b[min(i, len(b) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1:
            b[i:i] = bytes([rng.randrange(256)]) * rng.choice((1, 1, 2, 8, 64))
        elif op == 2 and b:
            del b[i:i + rng.randint(1, 16)]
        elif op == 3:
            other = rng.choice(pool)
            j = rng.randrange(len(other) + 1)
            b[i:i] = other[j:j + rng.randint(1, 64)]
        elif op == 4 and b:
            j = rng.randrange(len(b))
            b[i:i] = b[j:j + rng.randint(1, 32)] * rng.randint(2, 50)
        elif op == 5:
            depth = rng.choice((10, 1000, 100_000))
            b[i:i] = rng.choice((b"[", b"{\"a\":", b"\x91")) * depth
        else:
            b[i:i] = rng.choice((b"9" * 5000, b"-1", b"1e999", b"null", b"\"\\ud800\"", b"\xc1", b"\x00"))
    return bytes(b)


def fuzz(name: str, seconds: float, rng: random.Random, out: Path | None) -> dict:
    target, seeds = TARGETS[name], corpus()[name]
    pool, findings, runs = list(seeds), collections.Counter(), 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        data = mutate(rng, rng.choice(pool), pool)
        runs += 1
        try:
            target(data)
        except Exception as exc:  # noqa: BLE001 - a finding
            key = f"{type(exc).__name__}: {str(exc).splitlines()[0][:100] if str(exc) else ''}"
            if key not in findings and out is not None:
                out.mkdir(parents=True, exist_ok=True)
                (out / f"{name}-{len(findings)}.bin").write_bytes(data)
                (out / f"{name}-{len(findings)}.txt").write_text(traceback.format_exc())
            findings[key] += 1
        else:
            if len(pool) < 256 and rng.random() < 0.01:
                pool.append(data)  # keep some inputs that parsed, to go further from them
    return {"target": name, "runs": runs, "findings": sum(findings.values()), "distinct": dict(findings)}


def run_atheris(name: str, seconds: float, out: Path) -> dict:
    """One target under atheris in a child process: (runs, findings) from libFuzzer's stats."""
    import re
    import subprocess
    import tempfile

    seeds = Path(tempfile.mkdtemp(prefix=f"fuzz-{name}-"))
    for i, data in enumerate(corpus()[name]):
        (seeds / f"seed-{i}").write_bytes(data)
    out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, __file__, "--atheris-child", name, f"-max_total_time={int(seconds)}",
                           "-print_final_stats=1", f"-artifact_prefix={out}/{name}-", "-rss_limit_mb=4096",
                           str(seeds)], capture_output=True, text=True, timeout=seconds + 300)
    log = proc.stdout + proc.stderr
    runs = re.search(r"stat::number_of_executed_units:\s*(\d+)", log)
    crashed = proc.returncode != 0
    first = next((line for line in log.splitlines() if "Uncaught Python exception" in line or "Error:" in line), "")
    return {"target": name, "runs": int(runs.group(1)) if runs else 0, "findings": int(crashed),
            "distinct": {first.strip()[:120] or f"exit {proc.returncode}": 1} if crashed else {}}


def atheris_child(name: str, argv: list[str]) -> None:
    import atheris

    with atheris.instrument_imports():
        import engine.adapters.kv_event_decode  # noqa: F401
        import engine.adapters.kv_event_state  # noqa: F401
        import engine.config  # noqa: F401
        import engine.http.openai_request  # noqa: F401
        import engine.model.config  # noqa: F401
        import engine.wire.protocol  # noqa: F401
        import gui.snapshot.bundle  # noqa: F401
        import gui.snapshot.bundle_limits  # noqa: F401
        import gui.snapshot.first_crossing  # noqa: F401
    atheris.Setup([sys.argv[0], *argv], TARGETS[name])
    atheris.Fuzz()


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--atheris-child":
        atheris_child(sys.argv[2], sys.argv[3:])
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=60.0, help="per target")
    p.add_argument("--targets", default=",".join(TARGETS))
    p.add_argument("--out", type=Path, help="write each distinct finding's input and traceback here")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--atheris", action="store_true", help="coverage-guided, with atheris (pip install atheris)")
    args = p.parse_args()
    names = [t for t in args.targets.split(",") if t]
    unknown = [t for t in names if t not in TARGETS]
    if unknown:
        p.error(f"unknown targets {unknown}; known: {', '.join(TARGETS)}")
    rng = random.Random(args.seed)
    print(f"| target | executions | findings | distinct |\n|---|---:|---:|---|")
    found = 0
    for name in names:
        r = (run_atheris(name, args.seconds, args.out or Path("fuzz-findings")) if args.atheris
             else fuzz(name, args.seconds, rng, args.out))
        found += r["findings"]
        distinct = "; ".join(f"{k} ({n})" for k, n in r["distinct"].items()) or "none"
        print(f"| {name} | {r['runs']:,} | {r['findings']:,} | {distinct} |", flush=True)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
