"""The operator CLI on a ``dg`` project as ``create-dagster`` lays it out (``[tool.dg.project] root_module``, a
``definitions`` module with ``@dg.definitions`` loading the ``defs/`` folder, the group as a component's
``defs.yaml``), and the group state's default file anchored to the project's root while ``DAGSTER_HOME`` is unset:
members under ``dg dev`` (code server in ``src/``, the project's root elsewhere) and ``streamgroup status`` from
any folder read one file. ``status`` names the store it reads, never creates one, and warns when the stream holds
the group's commits but the store has no state."""

from __future__ import annotations

import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, TopicPartition

from dagster_streamgroup.cli import main
from dagster_streamgroup.dagster.resources import KafkaStreamGroup, default_store_url
from tests.dagster.test_component_dg import DgProject, new_project
from tests.fixtures.kafka import TopicFactory

pytestmark = pytest.mark.kafka

STREAM_PY = '''
import dagster as dg


def process(context: dg.AssetExecutionContext, df: object) -> None:
    """Nothing: the CLI only loads the definitions."""
'''


@pytest.fixture
def dg_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[DgProject]:
    """A project whose package name is unique in this process (the CLI imports it here), forgotten after."""
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    monkeypatch.chdir(tmp_path)  # the CLI works from the project's root, as dg does; restored after
    project = new_project(tmp_path / "demo", name=f"demo_{uuid.uuid4().hex[:8]}")
    try:
        yield project
    finally:
        for path in [p for p in sys.path if p == str(project.src)]:
            sys.path.remove(path)
        for name in [n for n in sys.modules if n == project.name or n.startswith(project.name + ".")]:
            del sys.modules[name]


def add_group(project: DgProject, group: str, bootstrap: str, topic: str) -> None:
    folder = project.defs / "clicks"
    folder.mkdir()
    (folder / "stream.py").write_text(STREAM_PY)
    (folder / "defs.yaml").write_text(
        textwrap.dedent(
            f"""\
            type: dagster_streamgroup.KafkaStreamGroupComponent

            attributes:
              function: .stream:process
              group: {group}
              bootstrap_servers: {bootstrap}
              topics: [{topic}]
            """
        )
    )


def test_without_dagster_home_the_state_file_is_the_projects_from_any_folder(
    dg_project: DgProject, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The code server runs in ``src/``, ``dg dev`` and the fork server's runs in the root: one file for all."""
    expected = f"sqlite:///{dg_project.root / '.streamgroup' / 'streamgroup-state.db'}"
    for folder in (dg_project.root, dg_project.src, dg_project.defs):
        monkeypatch.chdir(folder)
        assert default_store_url() == expected
        assert KafkaStreamGroup(group="g", bootstrap_servers="127.0.0.1:9092", topics=["t"]).resolved_store_url() == (
            expected
        )
    monkeypatch.chdir(dg_project.root.parent)  # outside any project: the working directory's, as before
    assert default_store_url() == f"sqlite:///{dg_project.root.parent / '.streamgroup' / 'streamgroup-state.db'}"
    monkeypatch.setenv("DAGSTER_HOME", str(dg_project.home))
    assert default_store_url() == f"sqlite:///{dg_project.home / 'streamgroup-state.db'}"


def test_status_finds_the_projects_definitions_and_names_the_store_it_reads(
    dg_project: DgProject, kafka_bootstrap: str, kafka_topics: TopicFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = kafka_topics(partitions=2)
    group = f"g_{uuid.uuid4().hex[:8]}"
    add_group(dg_project, group, kafka_bootstrap, topic)
    state = dg_project.root / ".streamgroup" / "streamgroup-state.db"
    runner = CliRunner()

    monkeypatch.chdir(dg_project.src / dg_project.name)  # any folder of the project, no --definitions
    done = runner.invoke(main, ["status", "--group", group])
    assert done.exit_code == 0, done.output
    assert f"state: sqlite:///{state} (the default: store_url is not set)" in done.output
    assert f"{state} does not exist" in done.output and "has no state yet" in done.output
    assert not state.exists(), "status created the store it reads"
    assert "warning" not in done.output  # nothing committed anywhere: nothing to warn about

    # Members committed elsewhere: the stream holds the group's offsets (the members mirror every commit).
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, 7)], asynchronous=False)
    finally:
        consumer.close()
    monkeypatch.chdir(dg_project.root.parent)  # outside the project: --definitions names its folder
    done = runner.invoke(main, ["status", "--group", group, "--definitions", str(dg_project.root)])
    assert done.exit_code == 0, done.output
    assert f"state: sqlite:///{state}" in done.output
    assert f"warning: the stream holds committed offsets of group '{group}' on 1 shard(s) ({topic}:0=7)" in (
        " ".join(done.output.split())
    )
    assert not state.exists()

    # The definitions module itself given as the file: loaded as the project's module, not as a loose script.
    definitions = dg_project.src / dg_project.name / "definitions.py"
    done = runner.invoke(main, ["unpark", "--group", group, "--definitions", str(definitions), "--shard", "x"])
    assert done.exit_code == 2 and f"its state store {state} does not exist" in done.output, done.output
    assert not state.exists()


def test_when_nothing_loads_the_error_lists_what_was_tried(
    dg_project: DgProject, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = CliRunner()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    monkeypatch.chdir(outside)
    done = runner.invoke(main, ["status", "--group", "g"])
    assert done.exit_code == 2
    assert "no Definitions found; tried:" in done.output
    assert f"a dg project: none holds {outside}" in done.output
    assert f"{outside / 'definitions.py'}: does not exist" in done.output
    assert "give --definitions PATH" in done.output

    # A project whose definitions module fails to import: the module and the error, not a traceback.
    (dg_project.src / dg_project.name / "definitions.py").write_text("import no_such_module_here\n")
    monkeypatch.chdir(dg_project.root)
    done = runner.invoke(main, ["status", "--group", "g"])
    assert done.exit_code == 2
    assert f"the dg project at {dg_project.root} (pyproject.toml), module {dg_project.name}.definitions" in (
        " ".join(done.output.split())
    )
    assert "ModuleNotFoundError: No module named 'no_such_module_here'" in done.output
    assert "Traceback" not in done.output

    done = runner.invoke(main, ["status", "--group", "g", "--definitions", str(outside)])
    assert done.exit_code == 2 and "not a dg project's root" in done.output, done.output
