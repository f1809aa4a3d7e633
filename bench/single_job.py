"""The yardstick of the run economy: the example's user function over a set of ranges as ONE Spark job.

The example project is loaded in this process with the deployment's environment, so the function, the group
resource (its stream configuration and Spark split size) and the Spark resource (a Connect session on the
same server, or a classic session on the same master) are the deployment's own. What the deployment adds on
top of this (runs, their launches, sensor ticks, reading ranges twice, commits) is what ``ratio_single_job``
shows.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import dagster as dg

from dagster_streamgroup.dagster import tags as sgt
from dagster_streamgroup.dagster.resources import KafkaStreamGroup, StreamGroupResource, V3ioStreamGroup
from dagster_streamgroup.spark.ranges import ShardRange

EXAMPLE_MODULES = ("jobs.settings", "jobs.clickstream", "sensors.clickstream", "definitions")
"""Imported in this order (reloaded if already imported): settings are read from the environment at import."""
ALL_RANGES_SHARD = "bench-all-ranges"
"""The shard of the one range partition key a call is given, for functions that ask for one range."""

UserFunction = Callable[..., Any]


@dataclass(frozen=True)
class StreamAssetParts:
    """What one call of the user function needs: the function and the deployment's two resources."""

    fn: UserFunction
    group: StreamGroupResource
    spark: Any
    sink: Any = None
    """The asset's declared sink (``stream_asset(sink=...)``): the function returns its rows, the call writes them."""


def load_example(env: Mapping[str, str]) -> dg.Definitions:
    """The example's ``Definitions``, built with ``env`` (the deployment's ``CLICKSTREAM_*`` variables)."""
    os.environ.update(env)
    module: ModuleType | None = None
    for name in EXAMPLE_MODULES:
        module = importlib.reload(sys.modules[name]) if name in sys.modules else importlib.import_module(name)
    defs = getattr(module, "defs", None)
    if not isinstance(defs, dg.Definitions):
        raise RuntimeError("definitions.py of the example has no Definitions named defs")
    return defs


def stream_asset_parts(defs: dg.Definitions) -> StreamAssetParts:
    """The user function of the example's stream asset and the resources it runs with.

    ``stream_asset`` keeps the user's function in the closure of the asset's compute function (the asset
    decorator wraps it): it is taken from there, so the benchmark calls exactly what the runs call."""
    for asset in defs.assets or ():
        if not isinstance(asset, dg.AssetsDefinition):
            continue
        for metadata in asset.metadata_by_key.values():
            if sgt.TAG_GROUP not in metadata:
                continue
            compute: Any = asset.op.compute_fn
            wrapper = getattr(compute, "decorated_fn", compute)
            cells = dict(zip(wrapper.__code__.co_freevars, wrapper.__closure__ or (), strict=True))
            if "fn" not in cells:
                raise RuntimeError(f"stream asset {asset.key.to_user_string()}: no user function in its closure")
            resources = defs.resources or {}
            group = resources[str(metadata[sgt.PREFIX + "resource_key"])]
            spark = resources[str(metadata[sgt.PREFIX + "spark_resource_key"])]
            if not isinstance(group, StreamGroupResource):
                raise RuntimeError(f"resource of stream asset {asset.key.to_user_string()} is not a stream group")
            sink = cells["sink"].cell_contents if "sink" in cells else None
            return StreamAssetParts(cells["fn"].cell_contents, group, spark, sink)
    raise RuntimeError("the example defines no stream asset")


def read_ranges(spark: Any, group: StreamGroupResource, ranges: Sequence[ShardRange]) -> Any:
    """One lazy DataFrame of every range, read by the stream's data source as the runs read theirs."""
    if isinstance(group, KafkaStreamGroup):
        from dagster_streamgroup.spark.kafka_source import read_kafka_ranges

        return read_kafka_ranges(
            spark, group.stream_config(), list(ranges), max_records_per_partition=group.spark_split_records
        )
    if isinstance(group, V3ioStreamGroup):
        from dagster_streamgroup.spark.v3io_source import read_v3io_ranges

        return read_v3io_ranges(
            spark, group.stream_config(), list(ranges), max_records_per_partition=group.spark_split_records
        )
    raise TypeError(f"no range reader for {type(group).__name__}")


def call_user_function(parts: StreamAssetParts, spark: Any, ranges: Sequence[ShardRange]) -> None:
    """Call the example's user function ONCE over ``ranges`` in the session ``spark``: ``fn(context, df)``,
    ``df`` one read of the whole range set.

    The one place that knows how the function learns its ranges. The context answers both conventions the
    stream asset has had: ``ranges_of(context)`` reads the run config's ``ranges`` (a run over several ranges),
    ``range_of(context)`` of the one-range-per-run model read the partition key ``<shard>:<start>-<end>``,
    here one range that covers the call (shard ``bench-all-ranges``, offsets 0 to the number of records)."""
    df = read_ranges(spark, parts.group, ranges)
    records = sum(r.end - r.start for r in ranges)
    context = dg.build_asset_context(
        partition_key=f"{ALL_RANGES_SHARD}:0-{records}",
        asset_config={"ranges": [{"shard": r.shard, "start": r.start, "end": r.end} for r in ranges]},
    )
    out = parts.fn(context, df)
    if parts.sink is not None:  # a declared sink: its commit is part of the call, as it is of a run
        parts.sink.write(out, ranges)


def single_job_seconds(env: Mapping[str, str], ranges: Sequence[ShardRange], repeats: int = 3) -> dict[str, Any]:
    """The user function over ``ranges`` in one session of the deployment's kind: a warm-up call, then the
    best of ``repeats`` timed calls (each one read of the range set and one call)."""
    parts = stream_asset_parts(load_example(env))
    with dg.build_resources({"pyspark": parts.spark}) as resources:
        spark = resources.pyspark.spark_session
        started = time.perf_counter()
        call_user_function(parts, spark, ranges)
        warmup_s = time.perf_counter() - started
        timed = []
        for _ in range(repeats):
            started = time.perf_counter()
            call_user_function(parts, spark, ranges)
            timed.append(time.perf_counter() - started)
        if getattr(parts.spark, "remote", None) is None:
            spark.stop()  # a classic session's JVM would otherwise share the machine with what follows
    print(f"single job: warm-up {warmup_s:.2f} s, then {[round(t, 2) for t in timed]} s", flush=True)
    return {
        "single_job_s": round(min(timed), 3),
        "single_job_runs_s": [round(t, 3) for t in timed],
        "single_job_warmup_s": round(warmup_s, 3),
    }
