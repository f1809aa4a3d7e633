"""The chaos deployment's code location: a stream asset whose function records what it saw (``recorder``).

It is the example's shape (member sensors, a ``stream_asset``, Spark over the local Spark Connect server) on
a topic of the chaos run, with the group state in PostgreSQL (``CHAOS_STORE_URL``, read as ``dg.EnvVar`` so
its password never becomes a literal of the definitions). Settings come from ``CHAOS_*`` variables, which
``bench.chaos`` sets; a bad value stops the code location from loading with the variable's name.

With ``CHAOS_SECOND_GROUP`` and ``CHAOS_SECOND_TOPIC`` the location also holds a second, small group (its own
topic, asset, resource and member sensors) that consumes beside the main one for the whole run: two groups in
one code location, sharing its daemon, its code server and the state store, each checked on its own.
"""

from __future__ import annotations

import bisect
import os
import time
from typing import TYPE_CHECKING, Any

import dagster as dg

from bench.chaos import recorder, sinks
from bench.chaos.settings import ASSET, SECOND_ASSET, SECOND_RESOURCE, STORE_URL_ENV, settings_from_env
from dagster_streamgroup.dagster import KafkaStreamGroup, StreamSparkResource, member_sensors, ranges_of, stream_asset
from dagster_streamgroup.dagster.assets import run_ranges_of
from dagster_streamgroup.sinks import DeltaSink, KafkaTopicSink, SinkRun

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

SETTINGS = settings_from_env()
SINKS: tuple[DeltaSink, KafkaTopicSink] | None = (
    (
        sinks.delta_sink(SETTINGS.work_dir),
        sinks.kafka_sink(SETTINGS.bootstrap, SETTINGS.sink_topic, SETTINGS.group),
    )
    if SETTINGS.sink_topic is not None
    else None
)
"""With ``CHAOS_SINK_TOPIC``: the main group's runs commit their records into both (``bench.chaos.sinks``)."""


@stream_asset(group=SETTINGS.group, name=ASSET, kinds={"spark", "kafka"})
def chaos_ranges(context: dg.AssetExecutionContext, df: DataFrame) -> dict[str, Any]:
    """Records, per range, the offsets this run saw and their payloads' CRC-32 (so the check can tell a record
    from another one at the same offset); raises on poison records while the switch is on."""
    return record_ranges(context, df, hold=True)


def record_ranges(context: dg.AssetExecutionContext, df: DataFrame, *, hold: bool) -> dict[str, Any]:
    """What both groups' functions do: record what the run saw, raise on poison while the switch is on, and,
    with ``hold``, wait while the driver holds runs. Only the main group's runs are held: the faults that hold
    a run judge it against the main group's state and member sensors."""
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

    work = SETTINGS.work_dir
    ranges = ranges_of(context)
    specs = run_ranges_of(context)
    config = context.op_execution_context.op_config or {}
    table = df.select(
        F.concat_ws(":", "topic", "partition").alias("shard"),
        "offset",
        F.instr(F.col("value").cast("string"), recorder.POISON_MARKER).alias("poison"),
        F.crc32("value").alias("crc"),
    ).toArrow()
    shards = table.column("shard").to_pylist()
    offsets = table.column("offset").to_pylist()
    poison = table.column("poison").to_pylist()
    crcs = table.column("crc").to_pylist()
    # A run holds a range per shard; a backfill's wave may hold many ranges of a shard: each row to its range.
    starts = {shard: [r.start for r in ranges if r.shard == shard] for shard in {r.shard for r in ranges}}
    seen: dict[tuple[str, int], list[int]] = {(r.shard, r.start): [] for r in ranges}
    hashes: dict[tuple[str, int], dict[int, int]] = {(r.shard, r.start): {} for r in ranges}
    bad: dict[str, int] = dict.fromkeys(starts, 0)
    for shard, offset, mark, crc in zip(shards, offsets, poison, crcs, strict=True):
        of_shard = starts.get(shard) or [-1]
        at = (shard, of_shard[max(0, bisect.bisect_right(of_shard, int(offset)) - 1)])
        seen.setdefault(at, []).append(int(offset))
        hashes.setdefault(at, {}).setdefault(int(offset), int(crc))
        if mark:
            bad[shard] = bad.get(shard, 0) + 1
    raising = recorder.poisoned(work) and any(bad.values())
    backfill = config.get("member") is None
    now = time.time()
    records = [
        recorder.RangeRecord(
            run_id=context.run_id,
            run_key=config.get("run_key"),
            member=config.get("member"),
            pid=os.getpid(),
            shard=r.shard,
            start=r.start,
            end=r.end,
            intervals=recorder.intervals(seen.get((r.shard, r.start), [])),
            seen=len(seen.get((r.shard, r.start), [])),
            hashes=tuple(crc for _, crc in sorted(hashes.get((r.shard, r.start), {}).items())),
            poison=bad.get(r.shard, 0),
            raised=raising,
            backfill=backfill,
            at=now,
        )
        for r in ranges
    ]
    recorder.write_records(work, records)
    if raising:
        poisoned = ", ".join(f"{s} ({n})" for s, n in sorted(bad.items()) if n)
        raise ValueError(f"poison records in {poisoned} while {recorder.POISON_SWITCH} is on")
    if hold and SINKS is not None:  # before the hold, where the faults kill a run: after its sink commits
        rows = df.select("topic", "partition", "offset", "value").toArrow()
        run = SinkRun(group=SETTINGS.group, member=config.get("member"), run_key=config.get("run_key"))
        for sink in SINKS:
            sink.write(rows, specs, run)
    if hold and not backfill:
        recorder.hold_if_asked(
            work,
            recorder.HeldRun(
                run_id=context.run_id,
                run_key=config.get("run_key"),
                pid=os.getpid(),
                ranges=tuple((s.shard, s.start, s.end) for s in specs),
                member=config.get("member"),
            ),
        )
    return {"seen": sum(len(v) for v in seen.values())}


def group_resource(group: str, topic: str, store_url: str | dg.EnvVar) -> KafkaStreamGroup:
    """A group of the chaos deployment, with the chaos run's timing and retry policy."""
    return KafkaStreamGroup(
        group=group,
        bootstrap_servers=SETTINGS.bootstrap,
        topics=[topic],
        store_url=store_url,
        heartbeat_interval_s=SETTINGS.heartbeat_s,
        session_timeout_s=SETTINGS.session_timeout_s,
        drain_timeout_s=SETTINGS.drain_timeout_s,
        max_records_per_run=SETTINGS.max_records_per_run,
        min_backlog=SETTINGS.min_backlog,
        max_wait_s=SETTINGS.max_wait_s,
        max_attempts=SETTINGS.max_attempts,
        after_max_attempts=SETTINGS.after_max_attempts,
        carry_on_s=SETTINGS.carry_on_s,
    )


assets: list[dg.AssetsDefinition] = [chaos_ranges]
sensors = member_sensors(
    chaos_ranges,
    members=SETTINGS.members,
    heartbeat_interval_s=SETTINGS.heartbeat_s,
    default_status=dg.DefaultSensorStatus.RUNNING,
)
resources: dict[str, Any] = {
    "streamgroup": group_resource(SETTINGS.group, SETTINGS.topic, dg.EnvVar(STORE_URL_ENV)),
    "pyspark": StreamSparkResource(remote=SETTINGS.spark_remote),
}

if SETTINGS.second_group is not None and SETTINGS.second_topic is not None:
    # The second group (``two_groups``): its own topic, group, asset and member sensors, in the same code
    # location, under the same daemon and with the same state store as the main group.

    @stream_asset(
        group=SETTINGS.second_group, name=SECOND_ASSET, resource_key=SECOND_RESOURCE, kinds={"spark", "kafka"}
    )
    def chaos_second_ranges(context: dg.AssetExecutionContext, df: DataFrame) -> dict[str, Any]:
        """The second group's function: records what it saw, as the main group's does."""
        return record_ranges(context, df, hold=False)

    assets.append(chaos_second_ranges)
    sensors += member_sensors(
        chaos_second_ranges,
        members=SETTINGS.second_members,
        heartbeat_interval_s=SETTINGS.heartbeat_s,
        default_status=dg.DefaultSensorStatus.RUNNING,
    )
    resources[SECOND_RESOURCE] = group_resource(SETTINGS.second_group, SETTINGS.second_topic, dg.EnvVar(STORE_URL_ENV))

defs = dg.Definitions(assets=assets, sensors=sensors, resources=resources, executor=dg.in_process_executor)
