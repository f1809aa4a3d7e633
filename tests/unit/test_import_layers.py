"""The layers import only downwards: the run launcher and the patches stand below the Dagster layer
(``dagster_streamgroup.dagster``), so neither may import it, at module level or inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import dagster_streamgroup

PACKAGE = Path(dagster_streamgroup.__file__).parent
UPPER = "dagster_streamgroup.dagster"


def _imported(source: str, package: str) -> list[tuple[int, str]]:
    """Every module an import statement of a module of ``package`` names (``from a import b``: ``a`` and ``a.b``)."""
    tree = ast.parse(source)
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            out.append((node.lineno, base))
            out += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return out


def _upward(source: str, package: str, where: str) -> list[str]:
    return [
        f"{where}:{line} imports {name}"
        for line, name in _imported(source, package)
        if name == UPPER or name.startswith(UPPER + ".")
    ]


def _upward_in(path: Path) -> list[str]:
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    return _upward(path.read_text(), package, str(path.relative_to(PACKAGE.parent)))


@pytest.mark.parametrize("layer", ["launcher", "patches"])
def test_the_layer_does_not_import_the_dagster_layer(layer: str) -> None:
    files = sorted((PACKAGE / layer).rglob("*.py"))
    assert files, f"no modules found under {layer}/"
    assert [hit for path in files for hit in _upward_in(path)] == []


def test_the_check_sees_every_form_of_an_upward_import() -> None:
    """The detector itself: each way of writing the import is caught (a check that cannot fail proves nothing)."""
    forms = [
        "from dagster_streamgroup.dagster.tags import TAG_MEMBER",
        "import dagster_streamgroup.dagster.resources",
        "from dagster_streamgroup import dagster",
        "from ..dagster import tags",
        "def f():\n    from dagster_streamgroup.dagster.resources import release_cached_clients",
    ]
    for source in forms:
        assert _upward(source, "dagster_streamgroup.launcher", "probe"), source
    fine = "from dagster_streamgroup.run_tags import TAG_MEMBER\nimport dagster\nfrom . import pool\n"
    assert _upward(fine, "dagster_streamgroup.launcher", "probe") == []
