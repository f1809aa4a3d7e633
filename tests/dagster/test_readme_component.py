"""The README's quick start, both ways, loads as written and builds the same group: the Python block's
Definitions, and the Component's defs.yaml loaded by Dagster's component loading (as ``dg`` loads a project's
defs folder) with ``stream.py`` beside it holding the Python block's function without its decorator, as the
README says. Neither needs a broker: definitions connect to nothing when they load. The Python block's runs
against the local broker: test_readme_quick_start.py."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from dagster.components.testing import DefsFolderSandbox, create_defs_folder_sandbox

from dagster_streamgroup.dagster import KafkaStreamGroup, StreamSparkResource
from dagster_streamgroup.dagster.component import StreamGroupComponent
from tests.dagster.test_readme_quick_start import README, quick_start_block


@pytest.fixture
def sandbox() -> Iterator[DefsFolderSandbox]:
    with create_defs_folder_sandbox() as box:
        yield box


def python_defs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {}
    exec(compile(quick_start_block("definitions.py"), str(README), "exec"), namespace)
    return namespace


def stream_py() -> str:
    """The Python block's function without its decorator, named ``process``, and the imports it uses."""
    code = quick_start_block("definitions.py").split("\ndefs = ", 1)[0]
    code, count = re.subn(r"@stream_asset\([^)]*\)\ndef page_views_per_minute\(", "def process(", code)
    assert count == 1, "the README's function is no longer page_views_per_minute under @stream_asset(...)"
    return code


def test_the_python_quick_start_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    defs: dg.Definitions = python_defs(tmp_path, monkeypatch)["defs"]
    assert defs.get_assets_def("page_views_per_minute").partitions_def == dg.DynamicPartitionsDefinition(
        name="clickstream_shards"
    )
    assert sorted(s.name for s in defs.sensors or []) == [f"clickstream_member_{i}" for i in range(3)]
    assert isinstance((defs.resources or {})["streamgroup"], KafkaStreamGroup)


def test_the_components_yaml_loads_as_the_same_group(
    sandbox: DefsFolderSandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = sandbox.defs_folder_path / "clickstream"
    folder.mkdir(parents=True)
    (folder / "defs.yaml").write_text(quick_start_block("defs.yaml"))
    (folder / "stream.py").write_text(stream_py())
    with sandbox.load_component_and_build_defs(defs_path=folder) as (component, defs):
        assert isinstance(component, StreamGroupComponent)
        resources = defs.resources or {}
        by_yaml = next(r for r in resources.values() if isinstance(r, KafkaStreamGroup))
        assert any(isinstance(r, StreamSparkResource) for r in resources.values())
        asset = defs.get_assets_def("page_views_per_minute")
        sensors = {s.name: s for s in defs.sensors or []}
    python = python_defs(tmp_path, monkeypatch)["defs"]
    by_python = (python.resources or {})["streamgroup"]
    assert by_yaml == by_python, "the YAML's group resource is the Python one"
    assert asset.partitions_def == python.get_assets_def("page_views_per_minute").partitions_def
    python_sensors = {s.name: s for s in python.sensors or []}
    assert sorted(sensors) == sorted(python_sensors)
    for name, sensor in sensors.items():
        assert isinstance(sensor, dg.SensorDefinition)
        assert sensor.default_status == python_sensors[name].default_status == dg.DefaultSensorStatus.RUNNING
        assert sensor.minimum_interval_seconds == python_sensors[name].minimum_interval_seconds == 5
