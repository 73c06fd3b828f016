"""The import contracts of docs/ARCHITECTURE.md ("Layers"), enforced by import-linter: the
contracts in pyproject.toml hold on the tree, they catch a planted violation, and what the
GUI really imports (every gui.* module, followed through everything it imports) loads no
torch."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

from engine.config import REPO_ROOT as REPO  # noqa: E402

LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint(cwd: Path, config: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT_IMPORTS), "--config", str(config), "--no-cache"], cwd=cwd,
                          capture_output=True, text=True, timeout=300, env={"PYTHONPATH": str(cwd), "PATH": ""})


def test_the_import_contracts_hold():
    proc = _lint(REPO, REPO / "pyproject.toml")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    assert re.search(rf"Contracts: {len(contracts)} kept, 0 broken", proc.stdout), proc.stdout[-2000:]


def _fake_tree(root: Path, files: dict[str, str]) -> None:
    """The project's package layout (empty modules), plus `files`."""
    packages = ["engine", "engine/wire", "engine/client", "engine/adapters", "engine/commands", "engine/server",
                "engine/workers", "engine/kv", "engine/model", "engine/guard", "engine/http", "engine/evidence",
                "engine/vllm_agent", "gui", "gui/model", "gui/snapshot", "gui/widgets", "kernels"]
    modules = ["gui/main_window.py", "gui/app.py"] + [f"engine/{name}.py" for name in (
        "core", "model_runner", "attention", "scheduler", "sampling", "request", "isolate", "admission",
        "pool_memory", "capacity", "dense_reference", "config", "errors", "parent_watch")]
    for package in packages:
        (root / package).mkdir(parents=True, exist_ok=True)
        (root / package / "__init__.py").write_text("")
    for module in modules:
        (root / module).write_text("")
    for name, text in files.items():
        (root / name).write_text(textwrap.dedent(text))


def test_the_contracts_catch_planted_violations(tmp_path):
    config = tmp_path / "contracts.toml"
    section = (REPO / "pyproject.toml").read_text().split("# Import contracts", 1)[1]
    config.write_text("# Import contracts" + section)
    plants = {
        "gui imports the server": {"gui/view.py": "import engine.server.supervisor_x\n",
                                   "engine/server/supervisor_x.py": ""},
        "gui reaches the runner through the client": {"gui/view.py": "import engine.client.helper\n",
                                                      "engine/client/helper.py": "import engine.core\n"},
        "the wire imports the client": {"engine/wire/protocol.py": "import engine.client.x\n",
                                        "engine/client/x.py": ""},
        "the engine imports Qt": {"engine/kv/pool.py": "import PySide6\n"},
        "a worker imports the server": {"engine/workers/loop.py": "import engine.server.pool\n",
                                        "engine/server/pool.py": ""},
        "the KV pool imports the model runner": {"engine/kv/pool.py": "import engine.model_runner\n"},
        "the GUI's model imports Qt": {"gui/model/colors.py": "import pyqtgraph\n"},
        "the snapshot code imports a widget": {"gui/snapshot/report_x.py": "import gui.widgets.table\n",
                                               "gui/widgets/table.py": ""},
        "a cycle": {"engine/server/a.py": "import engine.server.b\n", "engine/server/b.py": "import engine.server.a\n"},
    }
    for what, files in plants.items():
        root = tmp_path / re.sub(r"\W+", "-", what)
        _fake_tree(root, files)
        proc = _lint(root, config)
        assert proc.returncode == 1 and "BROKEN" in proc.stdout, (what, proc.stdout[-3000:], proc.stderr[-2000:])
    clean = tmp_path / "clean"
    _fake_tree(clean, {"gui/view.py": "import engine.client\nimport engine.wire\nimport engine.adapters\n"})
    proc = _lint(clean, config)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


def test_every_gui_module_imports_without_torch():
    modules = sorted(".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
                     for p in (REPO / "gui").rglob("*.py"))
    code = ("import importlib, sys\n"
            f"for name in {modules!r}:\n"
            "    importlib.import_module(name)\n"
            "heavy = sorted(m for m in ('torch', 'triton', 'transformers', 'engine.server', 'engine.workers', "
            "'engine.kv', 'kernels') if m in sys.modules)\n"
            "print(len(sys.modules), heavy)\n"
            "sys.exit(1 if heavy else 0)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={"QT_QPA_PLATFORM": "offscreen", "PATH": ""})
    assert len(modules) > 30
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]


GUI_MAY_IMPORT = ("engine.wire", "engine.client", "engine.adapters", "engine.evidence", "engine.parent_watch")


def test_the_app_imports_only_an_allowed_list_of_engine_packages():
    """An allowlist, not a blocklist: a new engine package is out of the app's reach until it is
    named here (the forbidden contracts in pyproject.toml hold the chains behind these)."""
    import grimp

    graph = grimp.build_graph("gui", "engine", include_external_packages=False)
    reached = {(module, imported) for module in graph.modules if module.split(".")[0] == "gui"
               for imported in graph.find_modules_directly_imported_by(module) if imported.split(".")[0] == "engine"}
    outside = sorted((m, i) for m, i in reached
                     if not any(i == allowed or i.startswith(allowed + ".") for allowed in GUI_MAY_IMPORT))
    assert reached and outside == [], outside
