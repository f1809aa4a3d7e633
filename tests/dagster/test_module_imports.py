"""Every module of the package, the example (``jobs``, ``sensors``) and the benchmarks imports.

Type checkers read annotations under ``TYPE_CHECKING`` without running them, so an annotation that names a
type-checking-only import unquoted in a module without ``from __future__ import annotations`` passes ruff and
mypy and fails only at import, in whatever test or deployment loads the module first."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("dagster_streamgroup", "jobs", "sensors", "bench")
NEEDS_ITS_DEPLOYMENT = {"bench.chaos.definitions"}
"""A code location that reads its deployment's settings at import (and says which are missing)."""


def module_names() -> list[str]:
    names = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__main__":  # running it is what importing it does
                continue
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            if name not in NEEDS_ITS_DEPLOYMENT:
                names.append(name)
    return names


def test_every_module_imports() -> None:
    names = module_names()
    assert len(names) > 150 and "jobs.clickstream" in names
    failures = {}
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # each failure is reported with its module
            failures[name] = f"{type(exc).__name__}: {exc}"
    assert failures == {}


def test_a_module_that_fails_at_import_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: the defect it exists for (an unquoted type-checking-only annotation)."""
    (tmp_path / "broken_annotation.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pyspark.sql import DataFrame\n"
        "def f(df: DataFrame) -> None: ...\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(NameError, match="DataFrame"):
        importlib.import_module("broken_annotation")
