"""Packages an install may leave out: the Docker image drops matplotlib and tensorboard, which a
peer needs only for `swarm bench` plots and for `--tensorboard` (`pip install -e .` has both).

`require` fails before any work starts, in one sentence that names the pinned package to install.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import re

DISTRIBUTION = "subspace-swarm"


def pinned(package: str) -> str:
    """`package` as this distribution requires it (e.g. "tensorboard==2.21.0"), else its bare name."""
    try:
        requirements = importlib.metadata.requires(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return package
    for req in requirements:
        spec, _, marker = req.partition(";")
        name = re.match(r"[A-Za-z0-9._-]+", spec.strip())
        if name and name.group().lower() == package.lower() and "extra" not in marker:
            return spec.strip()
    return package


def require(package: str, what: str) -> None:
    """Raise ValueError (one sentence: what to install) if `package` cannot be imported."""
    if importlib.util.find_spec(package) is None:
        raise ValueError(f"{what} needs {package}, which this install leaves out (the Docker image does): "
                         f"pip install '{pinned(package)}'.")
