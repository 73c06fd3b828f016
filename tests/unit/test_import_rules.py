"""The import rules of DESIGN.md, checked on the source: engine/ and kernels/ never import
gui/ or Qt; gui/ imports nothing from engine/ but protocol and client."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
QT = ("PySide6", "pyqtgraph", "shiboken6", "PyQt5", "PyQt6")
GUI_MAY_IMPORT = ("engine.protocol", "engine.client")


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def _sources(package: str) -> list[Path]:
    return sorted((REPO / package).rglob("*.py"))


@pytest.mark.parametrize("package", ["engine", "kernels"])
def test_core_packages_never_import_qt_or_gui(package):
    offenders = [
        f"{path.relative_to(REPO)} imports {name}"
        for path in _sources(package)
        for name in _imports(path)
        if name.split(".")[0] in (*QT, "gui")
    ]
    assert not offenders, offenders
    assert _sources(package), f"{package}/ has no sources to check"


def test_gui_imports_only_protocol_and_client_from_the_engine():
    offenders = [
        f"{path.relative_to(REPO)} imports {name}"
        for path in _sources("gui")
        for name in _imports(path)
        if name.split(".")[0] in ("engine", "kernels") and not name.startswith(GUI_MAY_IMPORT)
    ]
    assert not offenders, offenders


def test_the_checker_sees_a_planted_violation(tmp_path):
    planted = tmp_path / "bad.py"
    planted.write_text("import os\nfrom PySide6.QtCore import QObject\nfrom engine.runner import Engine\n")
    assert _imports(planted) == ["os", "PySide6.QtCore", "engine.runner"]


def test_protocol_and_client_do_not_import_torch():
    import subprocess
    import sys

    code = ("import sys; import engine.protocol, engine.client, engine.server.supervisor; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0
