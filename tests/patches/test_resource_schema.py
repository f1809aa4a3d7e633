"""This package's resources built with their config schema inferred once: the same schema as Dagster infers,
config and EnvVars resolved as before, and other classes left to Dagster."""

from __future__ import annotations

from collections.abc import Iterator

import dagster as dg
import pytest
from dagster._config.pythonic_config import config as pythonic_config
from dagster._config.pythonic_config import resource as pythonic_resource

from dagster_streamgroup.dagster import KafkaStreamGroup
from dagster_streamgroup.patches import resource_schema


@pytest.fixture
def installed() -> Iterator[None]:
    original = pythonic_resource.infer_schema_from_config_class
    try:
        assert resource_schema.install() and resource_schema.install(), "installing twice is harmless"
        yield
    finally:
        pythonic_resource.infer_schema_from_config_class = original


def kafka(**fields: object) -> KafkaStreamGroup:
    return KafkaStreamGroup(**{"group": "g", "bootstrap_servers": "127.0.0.1:9092", "topics": ["clicks"], **fields})


class Elsewhere(dg.ConfigurableResource):  # type: ignore[type-arg]
    name: str = "x"


def test_a_resource_of_the_package_reuses_the_schema_dagster_infers(installed: None) -> None:
    first, second = kafka(), kafka(min_backlog=5)
    assert first._schema is second._schema, "inferred once for the class"
    inferred = pythonic_config.infer_schema_from_config_class(KafkaStreamGroup)
    assert first._schema.config_type.key == inferred.config_type.key, "the schema Dagster infers"
    assert second._config_schema.as_field().default_value["min_backlog"] == 5, "values applied to a copy"
    assert first._config_schema.as_field().default_value.get("min_backlog", 20_000) == 20_000
    assert Elsewhere()._schema is not Elsewhere()._schema, "other classes are left to Dagster"


def test_resources_built_for_a_tick_resolve_config_and_env_vars_as_before(
    installed: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STREAMGROUP_TEST_GROUP", "from-env")
    with dg.build_resources({"streamgroup": kafka(group=dg.EnvVar("STREAMGROUP_TEST_GROUP"))}) as resources:
        assert resources.streamgroup.group == "from-env"
        assert resources.streamgroup.min_backlog == 20_000
    launch_config = {"group": "g", "bootstrap_servers": "127.0.0.1:9092", "topics": ["c"], "min_backlog": "many"}
    at_launch = dg.build_resources(
        {"streamgroup": KafkaStreamGroup.configure_at_launch()},
        resource_config={"streamgroup": {"config": launch_config}},
    )
    with pytest.raises(dg.DagsterInvalidConfigError, match="min_backlog"), at_launch:
        pass
