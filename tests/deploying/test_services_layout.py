"""The ``services`` layout of the deployment harness (``DagsterDev(layout="services")``): the code location it
serves with ``dagster api grpc`` and the workspace it points the daemon and the webserver at. The layout itself
runs in ``tests/e2e/test_smoke.py`` and ``bench.e2e``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml  # type: ignore[import-untyped]

from dagster_streamgroup.dagster.devserver import ROOT, CodeLocation, DagsterDev


def test_the_examples_workspace_is_served_from_its_file_and_directory() -> None:
    location = CodeLocation.of_workspace(ROOT / "workspace.yaml")
    assert location == CodeLocation("clickstream", "definitions.py", ROOT / ".")
    assert (location.working_directory / location.python_file).is_file()


def test_a_directory_relative_to_the_workspace_file(tmp_path: Path) -> None:
    workspace = tmp_path / "deploy" / "workspace.yaml"
    workspace.parent.mkdir()
    entry = {"relative_path": "defs.py", "working_directory": "../code", "location_name": "here"}
    workspace.write_text(yaml.safe_dump({"load_from": [{"python_file": entry}]}))
    location = CodeLocation.of_workspace(workspace)
    assert (location.name, location.python_file) == ("here", "defs.py")
    assert location.working_directory.resolve() == (tmp_path / "code").resolve()


@pytest.mark.parametrize(
    "load_from",
    [
        [{"python_module": "defs"}],
        [{"python_file": "a.py"}, {"python_file": "b.py"}],
        [{"grpc_server": {"host": "127.0.0.1", "port": 4000, "location_name": "x"}}],
    ],
)
def test_a_workspace_of_other_locations_is_refused(tmp_path: Path, load_from: list[object]) -> None:
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text(yaml.safe_dump({"load_from": load_from}))
    with pytest.raises(ValueError, match="one python_file code location"):
        CodeLocation.of_workspace(workspace)


def test_the_daemon_and_the_webserver_load_the_served_location(tmp_path: Path) -> None:
    dev = DagsterDev(tmp_path / "home", {}, tmp_path / "log", storage="sqlite", layout="services")
    command = dev.command()
    assert command[:2] == ["bash", "-c"]
    served = yaml.safe_load((tmp_path / "home" / "workspace-services.yaml").read_text())["load_from"]
    assert served == [{"grpc_server": {"host": "127.0.0.1", "port": int(command[5]), "location_name": "clickstream"}}]
    assert command[3:] == [
        "dagster-services",
        str(ROOT / ".venv/bin"),
        command[5],
        "definitions.py",
        str(ROOT.resolve()),
        "clickstream",
        str(tmp_path / "home" / "workspace-services.yaml"),
        str(dev.port),
    ]
    dev.close()
