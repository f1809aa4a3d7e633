"""The wheel holds the package and its ``py.typed`` and nothing else, with ranges for dependencies and the extras as
extras. Building it takes a second; installing and using it is ``scripts/test_wheel.sh`` (tests.packaging.wheel)."""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from tests.packaging.wheel import ROOT, UV, clean_env, find_python, wheel_problems


def test_the_built_wheel_is_the_package_only(tmp_path: Path) -> None:
    subprocess.run(
        [str(UV), "build", "--wheel", "--out-dir", str(tmp_path), str(ROOT)],
        cwd=tmp_path,
        env=clean_env(),
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("*.whl")
    assert wheel_problems(wheel) == []


def test_a_wheel_with_more_than_the_package_or_pinned_dependencies_is_refused(tmp_path: Path) -> None:
    wheel = tmp_path / "dagster_streamgroup-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("dagster_streamgroup/__init__.py", "")
        archive.writestr("tests/test_x.py", "")
        archive.writestr(
            "dagster_streamgroup-0.1.0.dist-info/METADATA",
            "Requires-Python: >=3.11\nRequires-Dist: dagster==1.13.27\nRequires-Dist: uvicorn>=0.54\n",
        )
    problems = wheel_problems(wheel)
    for expected in (
        "dagster_streamgroup/py.typed is missing",
        "tests/test_x.py is not part of the package",
        "Requires-Python is not >=3.11,<3.15",
        "no extra 'local'",
        "uvicorn>=0.54 is a runtime dependency",
        "dagster==1.13.27 is pinned, not a range",
        "no `streamgroup` console script",
    ):
        assert expected in problems, problems


def test_the_python_ci_runs_the_wheel_on_is_found_here() -> None:
    """CI's extra Python (3.12) comes from pyenv or PATH, never downloaded; a machine without it says so."""
    if shutil.which("pyenv") is None and shutil.which("python3.12") is None:
        pytest.skip("neither pyenv nor python3.12 here: scripts/test_wheel.sh names the missing Python")
    found = find_python("3.12")
    assert found is not None and Path(found).name == "python3.12"
    assert find_python("3.99") is None
