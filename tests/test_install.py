"""The installed environment is the one the project was tested with: `kernels` is this
repository's package, not a distribution of the same name pulled in by a dependency
(transformers 5.25 requires Hugging Face's `kernels`; with both installed, whichever comes
first on sys.path wins and the other one's importers fail)."""

from __future__ import annotations

import importlib.metadata
import pathlib

import kernels

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_kernels_is_this_repositorys_package():
    assert pathlib.Path(kernels.__file__).resolve().parent == REPO / "kernels"


def test_no_other_distribution_installs_a_kernels_package():
    owners = [name for name in importlib.metadata.packages_distributions().get("kernels", [])
              if name != "pagewarden"]
    assert not owners, (f"{owners} install a top-level package named 'kernels', the name of this "
                        "repository's kernels/: pin what pulls it in (constraints.txt, pyproject)")
