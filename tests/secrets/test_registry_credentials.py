"""The Schema Registry's credentials, given as docs/formats.md says (``dg.EnvVar``), searched for (as written, hex
and base64) in everything a typed run leaves: the run's events and logs in the Dagster instance's files, the group
state (its dead letters hold the records' errors), the materializations' metadata, the plans Spark shows of the
typed read, and the error of a run whose registry cannot be reached. The registry here does not enforce the
credentials; the client sends them with every request."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from dagster_streamgroup.dagster import StreamSparkResource
from dagster_streamgroup.local.kafka_broker import free_port
from tests.dagster.helpers import SensorDriver, group_name, group_resource, sensors_for
from tests.dagster.test_stream_asset import run
from tests.fixtures.kafka import TopicFactory
from tests.integration.formats.helpers import CLICK_V1, avro_values, produce
from tests.integration.formats.test_typed_records import collecting_asset
from tests.secrets.leaks import Evidence, describe, find_secrets

pytestmark = [pytest.mark.kafka, pytest.mark.spark]
USER_INFO_ENV = "SG_TEST_REGISTRY_USER_INFO"


@pytest.fixture(scope="module")
def spark() -> StreamSparkResource:
    return StreamSparkResource(master="local[1]")


def test_registry_credentials_appear_nowhere(
    kafka_bootstrap: str,
    kafka_topics: TopicFactory,
    registry_url: str,
    tmp_path: Path,
    spark: StreamSparkResource,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    password = secrets.token_urlsafe(24)
    monkeypatch.setenv(USER_INFO_ENV, f"streamgroup-svc:{password}")
    topic = kafka_topics(partitions=1)
    good = avro_values(registry_url, topic, CLICK_V1, [{"id": 1, "page": "/", "referrer": ""}])
    produce(kafka_bootstrap, topic, [good[0], b"not avro", good[0]])
    group = group_name()
    settings: dict[str, Any] = {
        "value_format": "avro",
        "schema_registry_basic_auth_user_info": dg.EnvVar(USER_INFO_ENV),
        "on_decode_error": "dead_letter",
        "max_records_per_run": 1000,
    }
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path, schema_registry_url=registry_url, **settings)
    rows: list[dict[str, Any]] = []
    asset = collecting_asset(group, rows)
    evidence = Evidence()
    home = tmp_path / "dagster-home"
    home.mkdir()
    with dg.instance_for_test(temp_dir=str(home)) as instance:
        driver = SensorDriver(sensors_for(asset, members=1)[0], instance, resource)
        result = run(asset, instance, resource, spark, driver.request())
        assert result.success and len(rows) == 2
        state = resource.member("reader").load()
        assert state is not None and state.dead_letters and state.dead_letters[0].dead_records == 1
        evidence.add("group state", state.model_dump_json())
        for event in result.all_events:
            evidence.add("run events", repr(event))
        for record in instance.all_logs(result.run_id):
            evidence.add("run logs", record.message or "")
        evidence.add("run config and tags", repr(instance.get_run_by_id(result.run_id)))
        with dg.build_resources({"r": resource}) as built:  # as a run resolves it: the EnvVar read
            df = built.r.read_ranges(spark.spark_session, {f"{topic}:0": (0, 3)})
            assert df.count() == 3
        plan: Any = df._jdf.queryExecution()
        evidence.add("spark plan", str(plan.toString()))
        evidence.add("spark plan", str(plan.analyzed().toString()))

        # The registry unreachable: the run fails, and its error names the registry, not the credentials.
        closed = f"http://127.0.0.1:{free_port()}/apis/ccompat/v7"
        down = group_resource(kafka_bootstrap, topic, group_name(), tmp_path / "down", schema_registry_url=closed,
                              schema_registry_timeout_s=1.0, **settings)  # fmt: skip
        down_asset = collecting_asset(down.group, [])
        down_driver = SensorDriver(sensors_for(down_asset, members=1)[0], instance, down)
        failed = run(down_asset, instance, down, spark, down_driver.request())
        assert not failed.success
        errors = [str(e.step_failure_data.error) for e in failed.all_events if e.is_step_failure]
        assert any(f"schema registry {closed}" in e for e in errors), errors
        evidence.add("failed run errors", "\n".join(errors))
        for record in instance.all_logs(failed.run_id):
            evidence.add("failed run logs", record.message or "")
    evidence.add_tree(home)
    evidence.add_tree(tmp_path)
    findings = find_secrets(evidence, {"registry_password": password})
    assert not findings, f"searched {evidence.summary()}:\n{describe(findings)}"
