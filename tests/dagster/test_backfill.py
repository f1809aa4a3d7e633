"""Backfills with real Spark (local), the real local broker and the SQLite store, run in process: the backfill asset
re-processes whole committed ranges in waves, writes each range's own output, moves no offset and leaves the stream
asset's latest materializations alone; it stops at the group's committed offset (unless the sink replaces rows by
their coordinates) and never processes a shard while a member's run holds it."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow.parquet as pq
import pytest

from dagster_streamgroup.dagster import (
    KafkaStreamGroup,
    StreamSparkResource,
    backfill_asset_of,
    range_key,
    ranges_of,
    stream_asset,
    with_range_column,
)
from dagster_streamgroup.dagster import tags as sgt
from dagster_streamgroup.dagster.backfill import ShardLease
from dagster_streamgroup.local.kafka_data import produce_records
from tests.dagster.helpers import SensorDriver, group_name, group_resource, ranges_of_request, sensors_for
from tests.fixtures.kafka import TopicFactory

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


@pytest.fixture(scope="module")
def spark() -> StreamSparkResource:
    return StreamSparkResource(master="local[1]")


Window = tuple[str, float, float]
"""(``member`` or ``backfill``, when the function started, when it ended)."""


def range_folders_asset(group: str, output: Path, windows: list[Window], hold_s: float = 0.0) -> dg.AssetsDefinition:
    """The example's sink: one Parquet folder per range, replaced by dynamic partition overwrite. A member's run
    holds its shard ``hold_s`` longer."""

    @stream_asset(group=group, name=f"events_{group}")
    def events(context: dg.AssetExecutionContext, df: Any) -> dict[str, Any]:
        started = time.monotonic()
        rows = with_range_column(df, ranges_of(context)).select("range", "partition", "offset")
        rows.write.mode("overwrite").option("partitionOverwriteMode", "dynamic").partitionBy("range").parquet(
            str(output)
        )
        kind = "backfill" if context.asset_key.path[-1].endswith("_backfill") else "member"
        if kind == "member":
            time.sleep(hold_s)
        windows.append((kind, started, time.monotonic()))
        return {"ranges_seen": dg.MetadataValue.int(len(ranges_of(context)))}

    return events


def member_run(
    asset: dg.AssetsDefinition, instance: dg.DagsterInstance, resources: dict[str, Any], request: dg.RunRequest
) -> dg.ExecuteInProcessResult:
    """A member's run request, executed as the daemon launches it."""
    assert request.tags is not None
    return dg.materialize(
        [asset, *([b] if (b := backfill_asset_of(asset)) else [])],
        selection=[asset.key],
        instance=instance,
        run_config=request.run_config,
        tags={**request.tags, "dagster/run_key": request.run_key or ""},
        resources=resources,
    )


def backfill_run(
    asset: dg.AssetsDefinition,
    instance: dg.DagsterInstance,
    resources: dict[str, Any],
    shard: str,
    start: int,
    end: int,
    **tags: str,
) -> dg.ExecuteInProcessResult:
    """A backfill of ``[start, end)`` of ``shard`` as the UI or ``streamgroup backfill`` launches one: the backfill
    asset's shard partition, the range in its tags."""
    backfill = backfill_asset_of(asset)
    assert backfill is not None
    resource = resources["streamgroup"]
    instance.add_dynamic_partitions(sgt.partitions_def_name(resource.group), [shard])
    return dg.materialize(
        [asset, backfill],
        selection=[backfill.key],
        instance=instance,
        partition_key=shard,
        tags={**sgt.backfill_tags(resource.group, shard, start, end), **tags},
        resources=resources,
        raise_on_error=False,
    )


def drain(driver: SensorDriver, asset: dg.AssetsDefinition, resources: dict[str, Any]) -> list[tuple[int, int]]:
    """Tick and run the member's requests until it has nothing to launch; the ranges it committed."""
    committed: list[tuple[int, int]] = []
    for _ in range(50):
        requests = driver.requests()
        if not requests:
            return committed
        for request in requests:
            assert member_run(asset, driver.instance, resources, request).success
            committed += [(s, e) for _, s, e in ranges_of_request(request)]
    raise AssertionError("the member kept launching")


def output_counts(output: Path) -> tuple[Counter[int], set[str]]:
    """How many rows of each offset the output holds, and its range folders."""
    offsets = pq.read_table(output, columns=["offset"]).column("offset").to_pylist()
    return Counter(int(o) for o in offsets), {p.name.removeprefix("range=") for p in output.glob("range=*")}


def backfill_materializations(result: dg.ExecuteInProcessResult, asset: dg.AssetsDefinition) -> list[dict[str, Any]]:
    backfill = backfill_asset_of(asset)
    assert backfill is not None
    events = result.asset_materializations_for_node(backfill.node_def.name)
    return [{"partition": m.partition, **{k: v.value for k, v in m.metadata.items()}} for m in events]


def test_a_backfill_replaces_whole_committed_ranges_in_waves_and_moves_nothing(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path, spark: StreamSparkResource
) -> None:
    topic = kafka_topics(partitions=1)
    shard = f"{topic}:0"
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path, max_records_per_run=250)
    resources = {"streamgroup": resource, "pyspark": spark}
    output, windows = tmp_path / "out", list[Window]()
    asset = range_folders_asset(group, output, windows)
    with dg.instance_for_test() as instance:
        driver = SensorDriver(sensors_for(asset, members=1)[0], instance, resource)
        committed: list[tuple[int, int]] = []
        for size in (90, 70, 110, 60, 100):  # five ranges of the group, each its own folder
            produce_records(kafka_bootstrap, topic, 0, [b"x"] * size)
            committed += drain(driver, asset, resources)
        assert committed == [(0, 90), (90, 160), (160, 270), (270, 330), (330, 430)]
        latest_before = instance.get_latest_materialization_event(asset.key)
        assert latest_before is not None

        result = backfill_run(asset, instance, resources, shard, 100, 400)
        assert result.success
        waves = backfill_materializations(result, asset)
        # [100, 400) cuts [90, 160) and [330, 430): taken whole; read in waves of at most 250 records
        assert [(w["start"], w["end"], w["ranges"]) for w in waves] == [(90, 330, 3), (330, 430, 1)]
        assert all(w["partition"] == shard and w["records"] == w["end"] - w["start"] for w in waves)
        assert waves[0]["requested"] == "[100, 400)" and waves[0]["group_committed"] == 430
        assert [w["ranges_seen"] for w in waves] == [3, 1], "the function sees each committed range of its wave"
        assert not any("lag" in w or "committed" in w for w in waves), "the group's lag is not a backfill's to say"

        counts, folders = output_counts(output)
        assert set(counts) == set(range(430)) and set(counts.values()) == {1}, "every record once"
        assert folders == {range_key(shard, s, e) for s, e in committed}, "each committed range's own folder"
        assert instance.get_latest_materialization_event(asset.key) == latest_before, "the group's latest stays"
        state = resource.member("reader").load()
        assert state is not None and state.shards[shard].committed == 430 and state.shards[shard].lease is None
        assert resource.backend().committed(group, [shard]) == {shard: 430}


def test_a_backfill_stops_at_the_committed_offset_so_nothing_is_written_twice(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path, spark: StreamSparkResource
) -> None:
    topic = kafka_topics(partitions=1)
    shard = f"{topic}:0"
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path, max_records_per_run=100)
    resources = {"streamgroup": resource, "pyspark": spark}
    output, windows = tmp_path / "out", list[Window]()
    asset = range_folders_asset(group, output, windows)
    with dg.instance_for_test() as instance:
        driver = SensorDriver(sensors_for(asset, members=1)[0], instance, resource)
        produce_records(kafka_bootstrap, topic, 0, [b"x"] * 150)
        request = driver.request()
        assert member_run(asset, instance, resources, request).success  # [0, 100) committed; [100, 150) waits
        ahead = backfill_run(asset, instance, resources, shard, 50, 150)
        assert ahead.success
        (wave,) = backfill_materializations(ahead, asset)
        assert (wave["start"], wave["end"]) == (0, 100), "clipped at the committed offset, the range taken whole"
        logs = [r.user_message for r in instance.all_logs(ahead.run_id)]
        assert any("past the group's committed offset 100" in line for line in logs)
        assert drain(driver, asset, resources) == [(100, 150)], "the group processes the rest itself"
        counts, _ = output_counts(output)
        assert set(counts) == set(range(150)) and set(counts.values()) == {1}, "no record twice"

        produce_records(kafka_bootstrap, topic, 0, [b"x"] * 10)
        not_yet = backfill_run(asset, instance, resources, shard, 150, 160)
        assert not not_yet.success and "not committed yet" in failure_of(not_yet)


def test_a_backfill_waits_for_the_member_run_that_holds_its_shard(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path, spark: StreamSparkResource
) -> None:
    topic = kafka_topics(partitions=1)
    shard = f"{topic}:0"
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path, max_records_per_run=300)
    resources = {"streamgroup": resource, "pyspark": spark}
    output, windows = tmp_path / "out", list[Window]()
    asset = range_folders_asset(group, output, windows, hold_s=3.0)
    with dg.instance_for_test() as instance:
        driver = SensorDriver(sensors_for(asset, members=1)[0], instance, resource)
        produce_records(kafka_bootstrap, topic, 0, [b"x"] * 200)
        assert drain(driver, asset, resources) == [(0, 200)]
        produce_records(kafka_bootstrap, topic, 0, [b"x"] * 100)
        holding = driver.request()  # [200, 300) in flight: its run holds the shard
        done: list[dg.ExecuteInProcessResult] = []
        thread = threading.Thread(target=lambda: done.append(backfill_run(asset, instance, resources, shard, 0, 200)))
        thread.start()
        deadline = time.monotonic() + 30
        while (lease := resource.store().load(resource.state_key())[0].shards[shard].lease) is None:  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the backfill asked for the shard"
            time.sleep(0.2)
        assert lease.granted_at is None, "it waits while the member's range is in flight"
        produce_records(kafka_bootstrap, topic, 0, [b"x"] * 50)
        assert member_run(asset, instance, resources, holding).success
        assert driver.requests() == [], "no member plans the shard while the backfill holds or waits for it"
        thread.join(timeout=120)
        assert done and done[0].success
        member_window = next(w for w in windows if w[0] == "member" and w[2] - w[1] >= 3.0)
        backfill_window = next(w for w in windows if w[0] == "backfill")
        assert backfill_window[1] >= member_window[2], "the backfill read after the member's run let the shard go"
        assert ranges_of_request(driver.request()) == [(shard, 300, 350)], "released, the group goes on"


def test_a_sink_that_replaces_by_coordinates_may_be_backfilled_past_the_group(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path, spark: StreamSparkResource
) -> None:
    """Such a sink needs no alignment and no clipping: the group's later run replaces the backfill's rows."""
    topic = kafka_topics(partitions=1)
    shard = f"{topic}:0"
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path, max_records_per_run=100)
    resources = {"streamgroup": resource, "pyspark": spark}
    table = tmp_path / "rows.db"
    with sqlite3.connect(table) as db:
        db.execute("create table rows (shard text, offset integer, writer text, primary key (shard, offset))")

    @stream_asset(group=group, name=f"events_{group}", replaces_by_coordinates=True)
    def events(context: dg.AssetExecutionContext, df: Any) -> None:
        writer = "backfill" if context.asset_key.path[-1].endswith("_backfill") else "member"
        rows = [
            (f"{topic}:{r['partition']}", int(r["offset"]), writer) for r in df.select("partition", "offset").collect()
        ]
        with sqlite3.connect(table) as db:  # a merge on the source coordinates
            db.executemany("insert or replace into rows values (?, ?, ?)", rows)

    with dg.instance_for_test() as instance:
        driver = SensorDriver(sensors_for(events, members=1)[0], instance, resource)
        produce_records(kafka_bootstrap, topic, 0, [b"x"] * 150)
        assert member_run(events, instance, resources, driver.request()).success  # [0, 100) committed
        ahead = backfill_run(events, instance, resources, shard, 50, 150)
        assert ahead.success
        (wave,) = backfill_materializations(ahead, events)
        assert (wave["start"], wave["end"], wave["aligned"]) == (50, 150, False), "past the group's offset, as asked"
        assert drain(driver, events, resources) == [(100, 150)]
        with sqlite3.connect(table) as db:
            rows = db.execute("select offset, writer from rows order by offset").fetchall()
        assert [o for o, _ in rows] == list(range(150)), "every record once"
        assert {w for o, w in rows if o >= 100} == {"member"}, "the group's run replaced the backfill's rows"


def failure_of(result: dg.ExecuteInProcessResult) -> str:
    """What the failed step of a run said."""
    for node in result.job_def.nodes:
        failure = result.failure_data_for_node(node.name)
        if failure is not None:
            user = failure.user_failure_data
            return (user.description or "") if user is not None else str(failure.error)
    raise AssertionError("no step failed")


def test_a_run_of_the_stream_asset_without_a_member_points_to_the_backfill_asset(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path, spark: StreamSparkResource
) -> None:
    topic = kafka_topics(partitions=1)
    group = group_name()
    resource: KafkaStreamGroup = group_resource(kafka_bootstrap, topic, group, tmp_path)
    asset = range_folders_asset(group, tmp_path / "out", [])
    config = {"ops": {asset.node_def.name: {"config": {"ranges": [{"shard": f"{topic}:0", "start": 0, "end": 5}]}}}}
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [asset],
            instance=instance,
            run_config=config,
            resources={"streamgroup": resource, "pyspark": spark},
            raise_on_error=False,
        )
        assert not result.success
        assert f"backfill events_{group}_backfill" in failure_of(result)
        backfill = backfill_asset_of(asset)
        assert backfill is not None
        instance.add_dynamic_partitions(sgt.partitions_def_name(group), [f"{topic}:0"])
        bare = dg.materialize(
            [asset, backfill],
            selection=[backfill.key],
            instance=instance,
            partition_key=f"{topic}:0",
            resources={"streamgroup": resource, "pyspark": spark},
            raise_on_error=False,
        )
        assert not bare.success and f"the tags {sgt.TAG_START} and {sgt.TAG_END}" in failure_of(bare)


def test_a_backfill_that_gives_up_waiting_leaves_no_lease_behind(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path
) -> None:
    """Its waiting lease would hold the shard back from the group until it expired."""
    topic = kafka_topics(partitions=1)
    shard = f"{topic}:0"
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path)
    asset = range_folders_asset(group, tmp_path / "out", [])
    with dg.instance_for_test() as instance:
        driver = SensorDriver(sensors_for(asset, members=1)[0], instance, resource)
        produce_records(kafka_bootstrap, topic, 0, [b"x"] * 10)
        holding = driver.request()  # its range stays in flight
        said: list[str] = []
        lease = ShardLease(resource, shard, "run-1", said.append, wait_s=1.5, beat_s=1.0)
        with pytest.raises(dg.Failure, match=r"not free within 2 s \(range \[0, 10\) of run .* is in flight\)"):
            lease.__enter__()
        assert said and "waiting for the shard" in said[0]
        state = resource.member("reader").load()
        assert state is not None and state.shards[shard].lease is None
        assert ranges_of_request(holding) == [(shard, 0, 10)]
