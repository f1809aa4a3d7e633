"""The stream asset with real Spark (local) and the real local broker: commit, refusal, failure (backfills:
test_backfill.py)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from dagster_streamgroup.dagster import (
    KafkaStreamGroup,
    StreamSparkResource,
    backfill_asset_of,
    ranges_of,
    stream_asset,
)
from dagster_streamgroup.dagster import tags as sgt
from dagster_streamgroup.local.kafka_data import produce_sample
from tests.dagster.gated_storage import GatedEventLogStorage, gated_instance_overrides
from tests.dagster.helpers import (
    SensorDriver,
    count_ranges,
    counting_asset,
    group_name,
    group_resource,
    ranges_of_request,
    sensors_for,
)
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
    request: dg.RunRequest | tuple[str, int, int],
    **tag_overrides: str,
) -> dg.ExecuteInProcessResult:
    """Materialize a run as the daemon would launch it (a RunRequest), or a backfill of ``(shard, start, end)``
    as the UI launches one (the backfill asset's shard partition, the range in tags)."""
    if not isinstance(request, dg.RunRequest):  # a RunRequest is a NamedTuple too
        shard, start, end = request
        backfill = backfill_asset_of(asset)
        assert backfill is not None
        instance.add_dynamic_partitions(sgt.partitions_def_name(resource.group), [shard])
        return dg.materialize(
            [asset, backfill],
            selection=[backfill.key],
            instance=instance,
            partition_key=shard,
            tags={**sgt.backfill_tags(resource.group, shard, start, end), **tag_overrides},
            resources={"streamgroup": resource, "pyspark": spark},
            raise_on_error=False,
        )
    assert request.tags is not None
    tags = {**request.tags, "dagster/run_key": request.run_key or ""}
    selection = dg.AssetSelection.assets(*(request.asset_selection or [asset.key]))
    if request.asset_check_keys is not None:  # as the daemon subsets the job: only the checks the request names
        selection = selection.without_checks() | dg.AssetSelection.checks(*request.asset_check_keys)
    return dg.materialize(
        [asset],
        selection=selection,
        instance=instance,
        run_config=request.run_config,
        tags={**tags, **tag_overrides},
        resources={"streamgroup": resource, "pyspark": spark},
        raise_on_error=False,
    )


def materializations(result: dg.ExecuteInProcessResult) -> dict[str, dict[str, Any]]:
    """Each range's materialization metadata, by shard partition."""
    out = {}
    for materialization in result.asset_materializations_for_node(result.job_def.nodes[0].name):
        assert materialization.partition is not None
        out[materialization.partition] = {k: v.value for k, v in materialization.metadata.items()}
    return out


def refusal_of(result: dg.ExecuteInProcessResult) -> str:
    failure = result.failure_data_for_node(result.job_def.nodes[0].name)
    assert failure is not None and failure.user_failure_data is not None
    return failure.user_failure_data.description or ""


def test_a_run_reads_every_range_commits_them_together_and_materializes_each_shard(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path, spark: StreamSparkResource
) -> None:
    topic = kafka_topics(partitions=2)
    produce_sample(kafka_bootstrap, topic, 2, 600)  # 301 records per partition
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path, max_records_per_run=1000)
    seen: list[tuple[str, int, int, int]] = []
    asset = counting_asset(group, seen)
    shards = [f"{topic}:0", f"{topic}:1"]
    with dg.instance_for_test() as instance:
        driver = SensorDriver(sensors_for(asset, members=1)[0], instance, resource)
        request = driver.request()
        result = run(asset, instance, resource, spark, request)
        assert result.success
        assert seen == [(shards[0], 0, 301, 301), (shards[1], 0, 301, 301)], "one call over both ranges"
        meta = materializations(result)
        assert sorted(meta) == shards
        for shard in shards:
            m = meta[shard]
            assert (m["shard"], m["start"], m["end"], m["records"], m["committed"], m["lag"]) == (
                shard,
                0,
                301,
                301,
                301,
                0,
            )
            assert (m["member"], m["epoch"], m["run_ranges"], m["run_records"]) == (driver.member_id, 1, 2, 602)
            assert m["seconds_behind"] == 0.0  # caught up: no record waits
            assert m["rows_seen"] == 602 and m["session_s"] >= 0 and m["process_s"] >= 0
        assert request.asset_check_keys == [] and not result.get_asset_check_evaluations(), (
            "a member's run plans and evaluates no check: its member's ticks do"
        )
        assert set(instance.get_dynamic_partitions(sgt.partitions_def_name(group))) == set(shards)

        state = resource.member("reader").load()
        assert state is not None and all(state.shards[s].committed == 301 for s in shards)
        assert resource.backend().committed(group, shards) == dict.fromkeys(shards, 301)
        assert not driver.requests(), "nothing left to read"


def test_a_second_execution_of_a_run_does_not_record_its_ranges_again(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path, spark: StreamSparkResource
) -> None:
    """A run executed twice (two workers of one run; here two Dagster runs of one request, the same key, member
    and epoch) commits once: the group accepts the second commit as made, and the second execution finds the
    range recorded and does not record it again."""
    topic = kafka_topics(partitions=1)
    produce_sample(kafka_bootstrap, topic, 1, 200)
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path)
    seen: list[tuple[str, int, int, int]] = []
    asset = counting_asset(group, seen)
    shard = f"{topic}:0"
    with dg.instance_for_test() as instance:
        driver = SensorDriver(sensors_for(asset, members=1)[0], instance, resource)
        request = driver.request()
        first = run(asset, instance, resource, spark, request)
        second = run(asset, instance, resource, spark, request)
        assert first.success and second.success
        assert [s[0] for s in seen] == [shard, shard], "both executions read the range"
        assert sorted(materializations(first)) == [shard]
        assert materializations(second) == {}, "the range is recorded twice"
        records = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=asset.key), limit=10).records
        assert len(records) == 1
        warnings = [r.user_message for r in instance.all_logs(second.run_id) if "recorded already" in r.user_message]
        assert len(warnings) == 1 and shard in warnings[0]
        state = resource.member("reader").load()
        assert state is not None and state.shards[shard].committed == materializations(first)[shard]["end"]


def test_a_run_carries_on_with_its_shards_next_ranges_in_waves(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path, spark: StreamSparkResource
) -> None:
    """With carry_on_s, one run reads the whole backlog in waves of max_records_per_run: each wave's ranges are
    what ranges_of gives the function, each is committed and materialized before the next is read, and the
    member's next tick finds every range recorded and nothing to launch."""
    topic = kafka_topics(partitions=2)
    produce_sample(kafka_bootstrap, topic, 2, 600)  # 301 records per partition
    group = group_name()
    resource = group_resource(
        kafka_bootstrap, topic, group, tmp_path, max_records_per_run=200, carry_on_s=120.0, max_wait_s=1.0
    )
    seen: list[tuple[str, int, int, int]] = []
    asset = counting_asset(group, seen)
    shards = [f"{topic}:0", f"{topic}:1"]
    with dg.instance_for_test() as instance:
        driver = SensorDriver(sensors_for(asset, members=1)[0], instance, resource)
        request = driver.request()
        result = run(asset, instance, resource, spark, request)
        assert result.success
        bounds = [(0, 100), (100, 200), (200, 300), (300, 301)]
        assert seen == [(shard, a, b, b - a) for a, b in bounds for shard in shards], "one call per wave"
        recorded = [
            {k: v.value for k, v in m.metadata.items()}
            for m in result.asset_materializations_for_node(result.job_def.nodes[0].name)
        ]
        assert [(m["shard"], m["start"], m["end"], m["records"], m["wave"]) for m in recorded] == [
            (shard, a, b, b - a, wave) for wave, (a, b) in enumerate(bounds) for shard in shards
        ]
        assert {m["run_key"] for m in recorded} == {request.run_key}
        state = resource.member(driver.member_id).load()
        assert state is not None and all(state.shards[s].committed == 301 for s in shards)
        assert resource.backend().committed(group, shards) == dict.fromkeys(shards, 301)
        assert not driver.requests(), "nothing left to read"
        state = resource.member(driver.member_id).load()
        assert state is not None and state.unrecorded_runs == {}, "every wave's ranges found recorded"


def test_a_carrying_run_reads_its_next_wave_while_the_last_ones_materializations_are_stored(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path, spark: StreamSparkResource
) -> None:
    """The first materialization waits (up to a minute) in Dagster's storage until the function is called for the
    next wave: the run ends only if that call came while the materialization was being stored. The next wave is
    still committed after it, so each shard's materializations stay in offset order."""
    topic = kafka_topics(partitions=2)
    produce_sample(kafka_bootstrap, topic, 2, 400)  # 201 records per partition
    group = group_name()
    resource = group_resource(
        kafka_bootstrap, topic, group, tmp_path, max_records_per_run=200, carry_on_s=120.0, max_wait_s=1.0
    )
    seen: list[tuple[str, int, int, int]] = []

    @stream_asset(group=group, name=f"gated_{group}")
    def gated(context: dg.AssetExecutionContext, df: Any) -> dict[str, Any]:
        if seen:
            GatedEventLogStorage.gate.set()
        return count_ranges(context, df, seen)

    GatedEventLogStorage.reset()
    with dg.instance_for_test(overrides=gated_instance_overrides(str(tmp_path / "events"))) as instance:
        driver = SensorDriver(sensors_for(gated, members=1)[0], instance, resource)
        result = run(gated, instance, resource, spark, driver.request())
        assert result.success
        assert GatedEventLogStorage.opened_in_time == [True], "the next wave was read while wave 0 was stored"
        shards = [f"{topic}:0", f"{topic}:1"]
        bounds = [(0, 100), (100, 200), (200, 201)]
        assert seen == [(shard, a, b, b - a) for a, b in bounds for shard in shards]
        stored = instance.fetch_materializations(dg.AssetKey(f"gated_{group}"), limit=100, ascending=True).records
        in_order = [
            (m.partition, m.metadata["start"].value, m.metadata["end"].value)
            for m in (r.asset_materialization for r in stored)
            if m is not None
        ]
        assert in_order == [(shard, a, b) for a, b in bounds for shard in shards]


def test_a_carrying_run_whose_next_wave_fails_keeps_the_committed_waves_materializations(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path, spark: StreamSparkResource
) -> None:
    """The next wave fails while the committed one's materializations are stored: those are all stored, the run
    fails with the next wave's error, and that wave's ranges are retried from where the commit left them."""
    topic = kafka_topics(partitions=2)
    produce_sample(kafka_bootstrap, topic, 2, 400)  # 201 records per partition
    group = group_name()
    resource = group_resource(
        kafka_bootstrap,
        topic,
        group,
        tmp_path,
        max_records_per_run=200,
        carry_on_s=120.0,
        max_wait_s=1.0,
        max_attempts=3,
    )
    seen: list[tuple[str, int, int, int]] = []
    calls: list[int] = []

    @stream_asset(group=group, name=f"second_fails_{group}")
    def second_fails(context: dg.AssetExecutionContext, df: Any) -> dict[str, Any]:
        calls.append(len(calls))
        if len(calls) == 2:
            raise RuntimeError("bad record in wave 1")
        return count_ranges(context, df, seen)

    shards = [f"{topic}:0", f"{topic}:1"]
    with dg.instance_for_test() as instance:
        driver = SensorDriver(sensors_for(second_fails, members=1)[0], instance, resource)
        failed = run(second_fails, instance, resource, spark, driver.request())
        assert not failed.success
        assert "bad record in wave 1" in str(failed.failure_data_for_node(failed.job_def.nodes[0].name))
        recorded = materializations(failed)
        assert sorted(recorded) == shards
        assert all((recorded[s]["start"], recorded[s]["end"], recorded[s]["wave"]) == (0, 100, 0) for s in shards)
        state = resource.member(driver.member_id).load()
        assert state is not None
        assert all(
            (state.shards[s].committed, state.shards[s].inflight, state.shards[s].attempt) == (100, None, 1)
            for s in shards
        )
        assert resource.backend().committed(group, shards) == dict.fromkeys(shards, 100)
        retried = sorted(r for request in driver.requests() for r in ranges_of_request(request))
        assert retried == [(s, 100, 200) for s in shards]


def run_logs(instance: dg.DagsterInstance, result: dg.ExecuteInProcessResult) -> list[str]:
    return [e.user_message for e in instance.all_logs(result.run_id)]


def test_a_carrying_run_whose_shards_are_caught_up_ends_at_its_commit(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path, spark: StreamSparkResource
) -> None:
    """Nothing written past its wave: the run ends instead of waiting max_wait_s for records that may not come."""
    topic = kafka_topics(partitions=1)
    produce_sample(kafka_bootstrap, topic, 1, 50)  # 51 records
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path, carry_on_s=120.0, max_wait_s=60.0)
    seen: list[tuple[str, int, int, int]] = []
    asset = counting_asset(group, seen)
    with dg.instance_for_test() as instance:
        driver = SensorDriver(sensors_for(asset, members=1)[0], instance, resource)
        started = time.monotonic()
        result = run(asset, instance, resource, spark, driver.request())
        assert result.success
        assert time.monotonic() - started < resource.max_wait_s, "ended without waiting max_wait_s"
        assert seen == [(f"{topic}:0", 0, 51, 51)]
        assert any("its shards are caught up, the run ends" in m for m in run_logs(instance, result))
        state = resource.member(driver.member_id).load()
        assert state is not None and state.shards[f"{topic}:0"].inflight is None


def test_a_carrying_run_waits_for_records_short_of_min_backlog_then_reads_them(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path, spark: StreamSparkResource
) -> None:
    """Records written during a wave, fewer than min_backlog: the run waits up to max_wait_s for more, then
    reads what came as its next wave."""
    topic = kafka_topics(partitions=1)
    produce_sample(kafka_bootstrap, topic, 1, 50)  # 51 records
    group = group_name()
    resource = group_resource(
        kafka_bootstrap, topic, group, tmp_path, carry_on_s=120.0, max_wait_s=2.0, min_backlog=1_000
    )
    seen: list[tuple[str, int, int, int]] = []

    @stream_asset(group=group, name=f"late_{group}")
    def late(context: dg.AssetExecutionContext, df: Any) -> None:
        for r in ranges_of(context):
            seen.append((r.shard, r.start, r.end, df.count()))
        if len(seen) == 1:
            produce_sample(kafka_bootstrap, topic, 1, 4)  # 5 more, written while the first wave is read

    shard = f"{topic}:0"
    with dg.instance_for_test() as instance:
        driver = SensorDriver(sensors_for(late, members=1)[0], instance, resource)
        assert not driver.requests(), "fewer than min_backlog: the tick waits max_wait_s"
        time.sleep(resource.max_wait_s)
        request = driver.request()
        assert ranges_of_request(request) == [(shard, 0, 51)]
        result = run(late, instance, resource, spark, request)
        assert result.success
        assert seen == [(shard, 0, 51, 51), (shard, 51, 56, 5)]
        logs = run_logs(instance, result)
        ended = [i for i, m in enumerate(logs) if "its shards are caught up, the run ends" in m]
        carried = [i for i, m in enumerate(logs) if "carries on with wave 1" in m]
        assert len(ended) == len(carried) == 1 and carried[0] < ended[0], "waited after wave 0, ended after wave 1"
        state = resource.member(driver.member_id).load()
        assert state is not None and state.shards[shard].committed == 56


def test_a_failing_function_is_retried_with_the_same_offsets(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path, spark: StreamSparkResource
) -> None:
    topic = kafka_topics(partitions=1)
    produce_sample(kafka_bootstrap, topic, 1, 100)
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path, max_attempts=3)
    seen: list[tuple[str, int, int, int]] = []
    asset = counting_asset(group, seen, fail_with=[RuntimeError("bad record")])
    shard = f"{topic}:0"
    with dg.instance_for_test() as instance:
        driver = SensorDriver(sensors_for(asset, members=1)[0], instance, resource)
        first = driver.request()
        failed = run(asset, instance, resource, spark, first)
        assert not failed.success
        state = resource.member("reader").load()
        assert state is not None
        assert state.shards[shard].inflight is None and state.shards[shard].attempt == 1
        assert state.shards[shard].committed == 0

        # Re-executing the failed run (or a Dagster run retry: both copy its config and tags) neither processes
        # the ranges nor reports anything: the group's own retry is the attempt that may commit.
        copy = run(asset, instance, resource, spark, first, **{"dagster/parent_run_id": failed.run_id})
        assert not copy.success
        assert f"re-executes member run {failed.run_id}" in refusal_of(copy)
        assert seen == []
        assert resource.member("reader").load() == state

        retry = driver.request()
        assert ranges_of_request(retry) == ranges_of_request(first) and retry.run_key != first.run_key
        assert run(asset, instance, resource, spark, retry).success
        assert seen == [(shard, 0, 101, 101)]
        state = resource.member("reader").load()
        assert state is not None and state.shards[shard].committed == 101


def test_metadata_dagster_rejects_fails_the_run_before_anything_is_committed(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path, spark: StreamSparkResource
) -> None:
    """Everything that could fail after the commit is checked before it: a committed range always gets its
    materialization, and a range whose run failed is retried."""
    topic = kafka_topics(partitions=1)
    produce_sample(kafka_bootstrap, topic, 1, 50)
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path)

    @stream_asset(group=group, name=f"bad_{group}")
    def bad(context: dg.AssetExecutionContext, df: Any) -> dict[str, Any]:
        return {"not storable": object()}

    shard = f"{topic}:0"
    with dg.instance_for_test() as instance:
        request = SensorDriver(sensors_for(bad, members=1)[0], instance, resource).request()
        result = run(bad, instance, resource, spark, request)
        assert not result.success
        assert "metadata Dagster cannot store" in refusal_of(result)
        state = resource.member("reader").load()
        assert state is not None and state.shards[shard].committed == 0 and state.shards[shard].attempt == 1
        assert resource.backend().committed(group, [shard]) == {shard: 0}, "only the starting offset, mirrored"


def test_a_commit_after_a_shard_moved_is_refused_whole_naming_the_new_owner(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path, spark: StreamSparkResource
) -> None:
    topic = kafka_topics(partitions=2)
    produce_sample(kafka_bootstrap, topic, 2, 200)
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path, drain_timeout_s=0.2)
    asset = counting_asset(group, [])
    shards = [f"{topic}:0", f"{topic}:1"]
    with dg.instance_for_test() as instance:
        old, new = (SensorDriver(s, instance, resource) for s in sensors_for(asset, members=2))
        stale = old.request()
        assert [s for s, _, _ in ranges_of_request(stale)] == shards
        assert resource.member(old.member_id).leave()
        time.sleep(0.3)  # the drain timeout passes: the ranges go to the remaining member under new epochs
        moved = new.request()
        assert moved.tags is not None and moved.tags[sgt.TAG_MEMBER] == new.member_id
        epoch = next(iter(moved.run_config["ops"].values()))["config"]["ranges"][0]["epoch"]

        refused = run(asset, instance, resource, spark, stale)
        assert not refused.success
        assert f"now owned by {new.member_id} at epoch {epoch}" in refusal_of(refused)
        state = resource.member("reader").load()
        assert state is not None and all(state.shards[s].committed == 0 for s in shards)
        assert resource.backend().committed(group, shards) == dict.fromkeys(shards, 0), "only the starting offsets"

        assert run(asset, instance, resource, spark, moved).success
        state = resource.member("reader").load()
        assert state is not None and all(state.shards[s].committed == 101 for s in shards)


@pytest.mark.slow
@pytest.mark.spark_connect
@pytest.mark.parametrize("reader", ["python", "spark-kafka", "auto"])
def test_a_run_over_spark_connect(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path, reader: str
) -> None:
    from pyspark.sql import SparkSession

    from dagster_streamgroup.local.spark_connect import running_connect_server

    if SparkSession.getActiveSession() is not None:
        pytest.skip(
            "PySpark refuses a Connect session in a process that already runs a classic one (an earlier test's); "
            "a Dagster run is a process of its own: scripts/test.sh runs it in a pytest of its own (-m spark_connect)"
        )
    topic = kafka_topics(partitions=2)
    produce_sample(kafka_bootstrap, topic, 2, 800)
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path, spark_reader=reader)
    seen: list[tuple[str, int, int, int]] = []
    asset = counting_asset(group, seen)
    with running_connect_server() as server, dg.instance_for_test() as instance:
        remote = StreamSparkResource(remote=server.remote)
        driver = SensorDriver(sensors_for(asset, members=1)[0], instance, resource)
        for expected in ((0, 150), (150, 300), (300, 401)):
            result = run(asset, instance, resource, remote, driver.request())
            assert result.success
            start, end = expected
            for meta in materializations(result).values():
                assert (meta["start"], meta["end"], meta["records"], meta["committed"]) == (
                    start,
                    end,
                    end - start,
                    end,
                )
        assert [rows for *_, rows in seen] == [150, 150, 150, 150, 101, 101]
        assert resource.backend().committed(group, [f"{topic}:0", f"{topic}:1"]) == {
            f"{topic}:0": 401,
            f"{topic}:1": 401,
        }
