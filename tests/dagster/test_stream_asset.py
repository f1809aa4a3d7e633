"""The stream asset with real Spark (local) and the real local broker: commit, refusal, failure, backfill."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from dagster_streamgroup.dagster import KafkaStreamGroup, StreamSparkResource
from dagster_streamgroup.dagster import tags as sgt
from dagster_streamgroup.dagster.checks import LAG_CHECK, PARKED_CHECK
from dagster_streamgroup.local.kafka_data import produce_sample
from tests.dagster.helpers import SensorDriver, counting_asset, group_name, group_resource, sensors_for
from tests.fixtures.kafka import TopicFactory

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


@pytest.fixture(scope="module")
def spark() -> StreamSparkResource:
    return StreamSparkResource(master="local[1]")


def run(
    asset: dg.AssetsDefinition,
    instance: dg.DagsterInstance,
    resource: KafkaStreamGroup,
    spark: StreamSparkResource,
    request: dg.RunRequest | str,
    **tag_overrides: str,
) -> dg.ExecuteInProcessResult:
    """Materialize one range as the daemon would launch it (a RunRequest) or as a backfill (a bare key)."""
    if isinstance(request, str):
        key, tags = request, {}
    else:
        assert request.partition_key is not None and request.tags is not None
        key, tags = request.partition_key, {**request.tags, "dagster/run_key": request.run_key or ""}
    instance.add_dynamic_partitions(sgt.partitions_def_name(resource.group), [key])
    return dg.materialize(
        [asset],
        instance=instance,
        partition_key=key,
        tags={**tags, **tag_overrides},
        resources={"streamgroup": resource, "pyspark": spark},
        raise_on_error=False,
    )


def metadata_of(result: dg.ExecuteInProcessResult) -> dict[str, Any]:
    [materialization] = result.asset_materializations_for_node(result.job_def.nodes[0].name)
    return {k: v.value for k, v in materialization.metadata.items()}


def test_a_run_reads_its_range_commits_and_materializes(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path, spark: StreamSparkResource
) -> None:
    topic = kafka_topics(partitions=2)
    produce_sample(kafka_bootstrap, topic, 2, 600)  # 301 records per partition
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path)
    seen: list[tuple[str, int]] = []
    asset = counting_asset(group, seen)
    with dg.instance_for_test() as instance:
        driver = SensorDriver(sensors_for(asset, members=1)[0], instance, resource)
        request = driver.requests()[f"{topic}:0"]
        result = run(asset, instance, resource, spark, request)
        assert result.success
        assert seen == [(f"{topic}:0:0-300", 300)]
        meta = metadata_of(result)
        assert (meta["shard"], meta["start"], meta["end"], meta["records"]) == (f"{topic}:0", 0, 300, 300)
        assert (meta["member"], meta["epoch"], meta["committed"], meta["lag"]) == (driver.sensor.name, 1, 300, 1)
        assert meta["rows_seen"] == 300 and meta["read_s"] >= 0 and meta["process_s"] >= 0
        checks = {c.check_name: c.passed for c in result.get_asset_check_evaluations()}
        assert checks == {LAG_CHECK: True, PARKED_CHECK: True}

        state = resource.member("reader").load()
        assert state is not None and state.shards[f"{topic}:0"].committed == 300
        assert resource.backend().committed(group, [f"{topic}:0"]) == {f"{topic}:0": 300}

        following = driver.requests()[f"{topic}:0"]
        assert following.partition_key == f"{topic}:0:300-301"

        # Backfill: the same range again, processed but never committed (offsets stay where they are).
        again = run(asset, instance, resource, spark, f"{topic}:0:0-300")
        assert again.success and seen[-1] == (f"{topic}:0:0-300", 300)
        assert metadata_of(again)["backfill"] is True
        state = resource.member("reader").load()
        assert state is not None and state.shards[f"{topic}:0"].committed == 300
        assert resource.backend().committed(group, [f"{topic}:0"]) == {f"{topic}:0": 300}


def test_a_failing_function_is_retried_with_the_same_offsets(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path, spark: StreamSparkResource
) -> None:
    topic = kafka_topics(partitions=1)
    produce_sample(kafka_bootstrap, topic, 1, 100)
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path, max_attempts=3)
    seen: list[tuple[str, int]] = []
    asset = counting_asset(group, seen, fail_with=[RuntimeError("bad record")])
    shard = f"{topic}:0"
    with dg.instance_for_test() as instance:
        driver = SensorDriver(sensors_for(asset, members=1)[0], instance, resource)
        first = driver.requests()[shard]
        failed = run(asset, instance, resource, spark, first)
        assert not failed.success
        state = resource.member("reader").load()
        assert state is not None
        assert state.shards[shard].inflight is None and state.shards[shard].attempt == 1
        assert state.shards[shard].committed == 0

        # Re-executing the failed run (or a Dagster run retry: both copy its range tags) neither processes
        # the range nor reports anything: the group's own retry is the attempt that may commit.
        copy = run(asset, instance, resource, spark, first, **{"dagster/parent_run_id": failed.run_id})
        assert not copy.success
        failure = copy.failure_data_for_node(copy.job_def.nodes[0].name)
        assert failure is not None and failure.user_failure_data is not None
        assert f"re-executes range run {failed.run_id}" in (failure.user_failure_data.description or "")
        assert seen == []
        assert resource.member("reader").load() == state

        retry = driver.requests()[shard]
        assert retry.partition_key == first.partition_key and retry.run_key != first.run_key
        assert run(asset, instance, resource, spark, retry).success
        assert seen == [(f"{shard}:0-101", 101)]
        state = resource.member("reader").load()
        assert state is not None and state.shards[shard].committed == 101


def test_a_commit_after_the_shard_moved_is_refused_naming_the_new_owner(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path, spark: StreamSparkResource
) -> None:
    topic = kafka_topics(partitions=1)
    produce_sample(kafka_bootstrap, topic, 1, 100)
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path, drain_timeout_s=0.2)
    asset = counting_asset(group, [])
    shard = f"{topic}:0"
    with dg.instance_for_test() as instance:
        old, new = (SensorDriver(s, instance, resource) for s in sensors_for(asset, members=2))
        stale = old.requests()[shard]
        assert resource.member(old.sensor.name).leave()
        time.sleep(0.3)  # the drain timeout passes: the range goes to the remaining member under a new epoch
        moved = new.requests()[shard]
        assert moved.tags is not None and moved.tags[sgt.TAG_MEMBER] == new.sensor.name

        refused = run(asset, instance, resource, spark, stale)
        assert not refused.success
        failure = refused.failure_data_for_node(refused.job_def.nodes[0].name)
        assert failure is not None and failure.user_failure_data is not None
        message = failure.user_failure_data.description or ""
        assert f"now owned by {new.sensor.name} at epoch {moved.tags[sgt.TAG_EPOCH]}" in message
        state = resource.member("reader").load()
        assert state is not None and state.shards[shard].committed == 0
        assert resource.backend().committed(group, [shard]) == {shard: None}

        assert run(asset, instance, resource, spark, moved).success
        state = resource.member("reader").load()
        assert state is not None and state.shards[shard].committed == 101


@pytest.mark.slow
@pytest.mark.spark_connect
def test_a_run_over_spark_connect(kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path) -> None:
    from pyspark.sql import SparkSession

    from dagster_streamgroup.local.spark_connect import running_connect_server

    if SparkSession.getActiveSession() is not None:
        pytest.skip(
            "PySpark refuses a Connect session in a process that already runs a classic one (an earlier test's); "
            "a Dagster run is a process of its own: scripts/test.sh runs it in a pytest of its own (-m spark_connect)"
        )
    topic = kafka_topics(partitions=1)
    produce_sample(kafka_bootstrap, topic, 1, 400)
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path)
    seen: list[tuple[str, int]] = []
    asset = counting_asset(group, seen)
    with running_connect_server() as server, dg.instance_for_test() as instance:
        remote = StreamSparkResource(remote=server.remote)
        driver = SensorDriver(sensors_for(asset, members=1)[0], instance, resource)
        for expected in ((0, 300), (300, 401)):
            request = driver.requests()[f"{topic}:0"]
            result = run(asset, instance, resource, remote, request)
            assert result.success
            meta = metadata_of(result)
            start, end = expected
            assert (meta["start"], meta["end"], meta["records"], meta["committed"]) == (start, end, end - start, end)
        assert [rows for _, rows in seen] == [300, 101]
        assert resource.backend().committed(group, [f"{topic}:0"]) == {f"{topic}:0": 401}
