"""The type checks of pyproject.toml ([tool.mypy]), run by mypy: the wire, the KV pool and the
supervisor pass under --strict; and the configuration catches what each package is held to
(planted in a copy of the layout)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from engine.config import REPO_ROOT as REPO

CHECKED = ["engine/wire", "engine/kv", "engine/server"]


def _mypy(cwd: Path, paths: list[str]) -> subprocess.CompletedProcess:
    # no cache: every run is a cold one (about 15 s for the packages) and writes nothing into the tree
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"),
                           f"--cache-dir={os.devnull}", *paths], cwd=cwd, capture_output=True, text=True, timeout=600)


def test_the_engine_core_type_checks():
    proc = _mypy(REPO, CHECKED)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert re.search(r"Success: no issues found in \d+ source files", proc.stdout), proc.stdout[-2000:]


def test_the_configuration_catches_planted_errors(tmp_path):
    untyped = "def first(items):\n    return items[0]\n"  # fine unless every def must be annotated
    wrong_body = """
        def count():
            total: int = "none"  # only seen when untyped bodies are checked
            return total
        """
    files = {
        "engine/wire/plant_untyped.py": untyped,
        "engine/wire/plant_generic.py": "def names() -> list:\n    return []\n",
        "engine/kv/plant_untyped.py": untyped,
        "engine/kv/plant_generic.py": "def names() -> list:\n    return []\n",
        "engine/kv/plant_body.py": wrong_body,  # strict: the missing annotations too
        "engine/server/plant_body.py": wrong_body,
        "engine/server/plant_untyped.py": untyped,
        "engine/server/plant_generic.py": "def names() -> list:\n    return []\n",
    }
    for package in ("engine", "engine/wire", "engine/kv", "engine/server"):
        (tmp_path / package).mkdir(parents=True, exist_ok=True)
        (tmp_path / package / "__init__.py").write_text("")
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    proc = _mypy(tmp_path, CHECKED)
    out = proc.stdout
    assert proc.returncode == 1, out[-3000:] + proc.stderr[-2000:]
    for expected in (r"engine/wire/plant_untyped\.py:1: error: .*\[no-untyped-def\]",
                     r"engine/wire/plant_generic\.py:1: error: .*\[type-arg\]",
                     r"engine/kv/plant_untyped\.py:1: error: .*\[no-untyped-def\]",
                     r"engine/kv/plant_generic\.py:1: error: .*\[type-arg\]",
                     r"engine/kv/plant_body\.py:2: error: .*\[no-untyped-def\]",
                     r"engine/kv/plant_body\.py:3: error: .*\[assignment\]",
                     r"engine/server/plant_body\.py:2: error: .*\[no-untyped-def\]",
                     r"engine/server/plant_body\.py:3: error: .*\[assignment\]",
                     r"engine/server/plant_untyped\.py:1: error: .*\[no-untyped-def\]",
                     r"engine/server/plant_generic\.py:1: error: .*\[type-arg\]"):
        assert re.search(expected, out), (expected, out[-3000:])
    assert re.search(r"Found 10 errors in 8 files", out), out[-3000:]
