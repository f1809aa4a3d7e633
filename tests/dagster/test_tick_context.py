"""A member tick's resource and instance: built once per process, as a code server's ticks find them."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import dagster as dg
import pytest

from dagster_streamgroup.dagster import tick_context

BUILT: list[str] = []
"""The names of the ``CountedResource`` objects Dagster initialised, in order."""


class CountedResource(dg.ConfigurableResource):  # type: ignore[type-arg]
    """Counts its initialisations: Dagster calls ``setup_for_execution`` once per build."""

    name: str

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        BUILT.append(self.name)


@pytest.fixture(autouse=True)
def released() -> Iterator[None]:
    tick_context.release()
    yield
    tick_context.release()


def test_the_group_resource_is_built_on_the_first_tick_only() -> None:
    BUILT.clear()
    defs = dg.Definitions(resources={"group": CountedResource(name="a")})
    first = tick_context.group_resource(dg.build_sensor_context(definitions=defs), "group")
    again = tick_context.group_resource(dg.build_sensor_context(definitions=defs), "group")
    assert isinstance(first, CountedResource) and first.name == "a"
    assert again is first
    assert BUILT == ["a"]

    other = dg.Definitions(resources={"group": CountedResource(name="b")})  # a location loaded anew
    assert tick_context.group_resource(dg.build_sensor_context(definitions=other), "group").name == "b"
    assert BUILT == ["a", "b"]


def test_resources_a_context_was_built_with_come_first() -> None:
    defs = dg.Definitions(resources={"group": CountedResource(name="location")})
    context = dg.build_sensor_context(definitions=defs, resources={"group": CountedResource(name="given")})
    assert tick_context.group_resource(context, "group").name == "given"
    without_location = dg.build_sensor_context(resources={"group": CountedResource(name="given")})
    assert tick_context.group_resource(without_location, "group").name == "given"


def test_ticks_at_once_build_the_resource_once() -> None:
    BUILT.clear()
    defs = dg.Definitions(resources={"group": CountedResource(name="shared")})
    with ThreadPoolExecutor(8) as pool:
        built = list(
            pool.map(
                lambda _: tick_context.group_resource(dg.build_sensor_context(definitions=defs), "group"), range(16)
            )
        )
    assert all(b is built[0] for b in built) and BUILT == ["shared"]


def test_the_kept_resources_are_bounded_and_the_least_recently_used_goes_first() -> None:
    BUILT.clear()
    locations = [dg.Definitions(resources={"group": CountedResource(name=f"r{i}")}) for i in range(3)]

    def tick(defs: dg.Definitions) -> None:
        tick_context.group_resource(dg.build_sensor_context(definitions=defs), "group")

    for defs in locations:
        tick(defs)
    for i in range(tick_context.KEPT_RESOURCES - 3):
        tick(locations[0])  # kept in use
        tick(dg.Definitions(resources={"group": CountedResource(name=f"other{i}")}))
    tick(locations[0])
    assert len(tick_context._resources) == tick_context.KEPT_RESOURCES
    tick(dg.Definitions(resources={"group": CountedResource(name="one more")}))  # r1, the least recent, goes
    assert len(tick_context._resources) == tick_context.KEPT_RESOURCES
    for defs in (locations[0], locations[2]):
        tick(defs)
    assert BUILT.count("r0") == BUILT.count("r2") == 1, "kept"
    tick(locations[1])
    assert BUILT.count("r1") == 2, "dropped, built again"


def test_the_instance_is_opened_once_per_reference() -> None:
    with dg.instance_for_test() as instance:
        ref = instance.get_ref()
        first = tick_context.tick_instance(dg.build_sensor_context(instance_ref=ref))
        again = tick_context.tick_instance(dg.build_sensor_context(instance_ref=ref))
        assert first is not None and again is first
        assert first.root_directory == instance.root_directory
        given = tick_context.tick_instance(dg.build_sensor_context(instance=instance))
        assert given is instance
        assert tick_context.tick_instance(dg.build_sensor_context()) is None
        tick_context.release()  # disposed before the test's instance directory goes


def test_a_code_server_ends_without_tracebacks(tmp_path: Path) -> None:
    """The resource a member tick builds in a gRPC worker thread is kept for the process and torn down at its exit,
    in the main thread. Built without an instance, Dagster gave it an ephemeral one whose in-memory SQLite
    storage holds a connection opened in the worker thread: closing it from the main thread printed six
    ``sqlite3.ProgrammingError`` tracebacks on every stop of ``dg dev`` / ``dagster dev``."""
    probe = Path(__file__).parent / "tick_context_probe" / "probe.py"
    done = subprocess.run(
        [sys.executable, str(probe), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert done.returncode == 0, done.stderr
    assert "KafkaStreamGroup in ThreadPoolExecutor" in done.stdout
    assert "Traceback" not in done.stderr and "ProgrammingError" not in done.stderr, done.stderr
