"""A member tick's resource and instance: built once per process, as a code server's ticks find them."""

from __future__ import annotations

import dagster as dg

from dagster_streamgroup.dagster import tick_context

BUILT: list[str] = []
"""The names of the ``CountedResource`` objects Dagster initialised, in order."""


class CountedResource(dg.ConfigurableResource):  # type: ignore[type-arg]
    """Counts its initialisations: Dagster calls ``setup_for_execution`` once per build."""

    name: str

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        BUILT.append(self.name)


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


def test_the_kept_resources_are_bounded() -> None:
    for i in range(tick_context.KEPT_RESOURCES + 3):
        defs = dg.Definitions(resources={"group": CountedResource(name=f"r{i}")})
        tick_context.group_resource(dg.build_sensor_context(definitions=defs), "group")
    assert len(tick_context._resources) <= tick_context.KEPT_RESOURCES


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
