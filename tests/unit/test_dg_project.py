"""Finding a ``dg`` project as ``dg`` finds it: the nearest ``dg.toml`` or ``pyproject.toml`` with ``[tool.dg]``,
a project only where its ``directory_type`` says so, and the definitions module ``dg`` loads."""

from __future__ import annotations

import string
import tempfile
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dagster_streamgroup.dagster.project import DgProjectError, find_dg_project

PYPROJECT = """\
[project]
name = "demo"

[tool.dg]
directory_type = "project"

[tool.dg.project]
root_module = "demo"
"""


def make_project(root: Path, pyproject: str = PYPROJECT) -> Path:
    (root / "src" / "demo" / "defs").mkdir(parents=True)
    (root / "pyproject.toml").write_text(pyproject)
    return root


def test_a_create_dagster_layout_is_found_from_its_root_and_below(tmp_path: Path) -> None:
    root = make_project(tmp_path / "demo")
    for start in (root, root / "src", root / "src" / "demo" / "defs"):
        project = find_dg_project(start)
        assert project is not None
        assert (project.root, project.root_module, project.definitions_module) == (root, "demo", "demo.definitions")
        assert project.source_dir == root / "src"


folder_names = st.text(alphabet=string.ascii_lowercase + "_-.", min_size=1, max_size=8).filter(
    lambda n: n not in {".", ".."}
)


@settings(max_examples=40, deadline=None)
@given(below=st.lists(folder_names, max_size=4))
def test_any_folder_of_the_project_finds_its_root(below: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = make_project(Path(tmp) / "demo")
        start = root.joinpath(*below)
        start.mkdir(parents=True, exist_ok=True)
        project = find_dg_project(start)
        assert project is not None and project.root == root.resolve()


def test_outside_a_project_or_in_a_workspace_there_is_none(tmp_path: Path) -> None:
    assert find_dg_project(tmp_path) is None
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "plain"\n')
    assert find_dg_project(tmp_path) is None  # a pyproject.toml without [tool.dg] is not dg's
    workspace = tmp_path / "ws"
    (workspace / "other").mkdir(parents=True)
    (workspace / "dg.toml").write_text('directory_type = "workspace"\n')
    assert find_dg_project(workspace / "other") is None


def test_dg_toml_wins_over_the_pyproject_beside_it_and_the_target_module_is_dgs(tmp_path: Path) -> None:
    root = make_project(tmp_path / "demo")
    (root / "dg.toml").write_text(
        textwrap.dedent(
            """\
            directory_type = "project"

            [project]
            root_module = "other"
            code_location_target_module = "other.code"
            """
        )
    )
    project = find_dg_project(root)
    assert project is not None
    assert (project.config_file.name, project.root_module, project.definitions_module) == (
        "dg.toml",
        "other",
        "other.code",
    )
    assert project.source_dir == root  # no src/other: the module is at the root


@pytest.mark.parametrize(
    ("pyproject", "message"),
    [
        ('[tool.dg]\ndirectory_type = "project"\n', r"\[tool.dg.project\] root_module is not set"),
        ("[tool.dg\n", "not readable TOML"),
    ],
)
def test_a_broken_configuration_names_the_file_and_key(tmp_path: Path, pyproject: str, message: str) -> None:
    (tmp_path / "pyproject.toml").write_text(pyproject)
    with pytest.raises(DgProjectError, match=message) as caught:
        find_dg_project(tmp_path)
    assert str(tmp_path / "pyproject.toml") in str(caught.value)
