"""The stream asset: one partition per offset range; a run reads it, calls user code, then commits.

The commit is the fenced transition in the group state (it fails if the shard moved to another member or
epoch), then the offset is mirrored into the backend. The materialization is written after the commit, so a
materialization always names a committed range. A run without a member's tags (a backfill) re-processes its
range and commits nothing.
"""

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import dagster as dg

from dagster_streamgroup.dagster import tags as sgt
from dagster_streamgroup.dagster.checks import check_specs, lag_check_result, parked_check_result
from dagster_streamgroup.dagster.resources import StreamGroupResource
from dagster_streamgroup.streams.base import StreamError

PARENT_RUN_ID_TAG = "dagster/parent_run_id"
"""Set by Dagster on a re-execution and on its automatic run retries, with the parent run's tags copied."""

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

StreamFn = Callable[[dg.AssetExecutionContext, "DataFrame"], Mapping[str, Any] | None]
"""The user's function: processes one range's DataFrame idempotently, may return extra metadata."""

MAX_REASON = 2000


class CommitRefusedError(dg.Failure):
    """The group refused the commit: the shard moved to another member or epoch while the run ran."""


def range_of(context: dg.AssetExecutionContext) -> tuple[str, int, int]:
    """``(shard, start, end)`` of the range a stream asset run processes."""
    return sgt.parse_range_partition_key(context.partition_key)


def stream_asset(
    *,
    group: str,
    name: str | None = None,
    key_prefix: str | Sequence[str] | None = None,
    resource_key: str = "streamgroup",
    spark_resource_key: str = "pyspark",
    description: str | None = None,
    group_name: str | None = None,
    kinds: set[str] | None = None,
    **asset_kwargs: Any,
) -> Callable[[StreamFn], dg.AssetsDefinition]:
    """Turn ``fn(context, df) -> metadata | None`` into the stream asset of consumer group ``group``.

    ``resource_key`` names a ``StreamGroupResource`` (e.g. ``KafkaStreamGroup``) whose ``group`` is
    ``group``; ``spark_resource_key`` a dagster-pyspark resource (``StreamSparkResource``)."""

    def decorate(fn: StreamFn) -> dg.AssetsDefinition:
        asset_name = name or fn.__name__
        prefix = [key_prefix] if isinstance(key_prefix, str) else list(key_prefix or [])
        asset_key = dg.AssetKey([*prefix, asset_name])
        partitions = dg.DynamicPartitionsDefinition(name=sgt.partitions_def_name(group))

        @dg.asset(  # type: ignore[untyped-decorator]
            key=asset_key,
            partitions_def=partitions,
            required_resource_keys={resource_key, spark_resource_key},
            check_specs=check_specs(asset_key),
            metadata={
                sgt.TAG_GROUP: group,
                sgt.PREFIX + "resource_key": resource_key,
                sgt.PREFIX + "spark_resource_key": spark_resource_key,
            },
            description=description or fn.__doc__ or f"Offset ranges of consumer group {group!r}.",
            group_name=group_name,
            kinds=kinds or {"spark"},
            **asset_kwargs,
        )
        def _stream_asset(context: dg.AssetExecutionContext) -> dg.MaterializeResult:  # type: ignore[type-arg]
            resource: StreamGroupResource = getattr(context.resources, resource_key)
            if resource.group != group:
                raise dg.Failure(f"resource {resource_key!r} is group {resource.group!r}, the asset needs {group!r}")
            spark_resource = getattr(context.resources, spark_resource_key)
            return run_range(context, resource, spark_resource, fn, asset_key)

        assert isinstance(_stream_asset, dg.AssetsDefinition)
        return _stream_asset

    return decorate


def run_range(
    context: dg.AssetExecutionContext,
    resource: StreamGroupResource,
    spark_resource: Any,
    fn: StreamFn,
    asset_key: dg.AssetKey,
) -> dg.MaterializeResult[Any]:
    shard, start, end = sgt.parse_range_partition_key(context.partition_key)
    report = sgt.report_from_tags(context.run.tags, shard, start, end)
    parent_run_id = context.run.parent_run_id or context.run.tags.get(PARENT_RUN_ID_TAG)
    if report is not None and parent_run_id is not None:
        # Re-execution and Dagster's run retries copy the range tags of the parent run. The group retries a
        # failed range itself, as a new attempt from its sensor, and only that run may commit: a copy would
        # process the range again and then have its commit refused.
        raise dg.Failure(
            description=f"run {context.run_id} re-executes range run {parent_run_id} "
            f"({shard} [{start}, {end}), attempt {context.run.tags.get(sgt.TAG_ATTEMPT, '?')}). The group retries "
            "failed ranges itself, as new attempts launched by its member sensors, and only those runs commit. "
            "To re-process the range without moving offsets, backfill it (`streamgroup backfill` or a UI "
            "backfill over the range partition)."
        )
    member = resource.member(report.member_id) if report is not None else None
    mode = "backfill (nothing is committed)" if report is None else f"member {report.member_id} epoch {report.epoch}"
    context.log.info(f"{resource.group}: {shard} [{start}, {end}) as {mode}")

    df: Any = None
    try:
        t0 = time.monotonic()
        spark = spark_resource.spark_session
        df = resource.read_range(spark, shard, start, end).persist()
        records = df.count()
        read_s = time.monotonic() - t0
        t1 = time.monotonic()
        extra = fn(context, df) or {}
        process_s = time.monotonic() - t1
    except Exception as exc:
        if member is not None and report is not None:
            reason = f"{type(exc).__name__}: {exc}"[:MAX_REASON]
            failed = member.fail(report, reason)
            context.log.error(f"{shard} [{start}, {end}) failed ({failed.value}): {reason}")
        raise
    finally:
        # Failed runs too: a shared Spark Connect server would otherwise keep their cached ranges. A session
        # too broken to unpersist has lost its cache anyway, and the run's own error is the one to report.
        if df is not None:
            with contextlib.suppress(Exception):
                df.unpersist()

    metadata: dict[str, dg.RawMetadataValue] = {
        "group": dg.MetadataValue.text(resource.group),
        "shard": dg.MetadataValue.text(shard),
        "start": dg.MetadataValue.int(start),
        "end": dg.MetadataValue.int(end),
        "records": dg.MetadataValue.int(records),
        "read_s": dg.MetadataValue.float(round(read_s, 3)),
        "process_s": dg.MetadataValue.float(round(process_s, 3)),
    }
    if member is not None and report is not None:
        outcome, stats = member.commit_state_only(report)
        if not outcome.accepted:
            raise CommitRefusedError(
                description=f"commit refused: {outcome.message}",
                metadata={"refusal": str(outcome.refusal), "owner": str(outcome.owner), "epoch": str(outcome.epoch)},
            )
        mirrored = True
        if not outcome.already_committed:
            try:
                resource.backend().commit(resource.group, {shard: end})
            except StreamError as exc:
                # The group state holds the commit; the next commit mirrors a later offset.
                mirrored = False
                context.log.warning(f"{shard}: committed in the group state, mirroring to the stream failed: {exc}")
        metadata.update(
            {
                "epoch": dg.MetadataValue.int(report.epoch),
                "member": dg.MetadataValue.text(report.member_id),
                "committed": dg.MetadataValue.int(end),
                "mirrored": dg.MetadataValue.bool(mirrored),
                "attempt": dg.MetadataValue.int(int(context.run.tags.get(sgt.TAG_ATTEMPT, "0"))),
            }
        )
        state = stats.state
    else:
        metadata["backfill"] = dg.MetadataValue.bool(True)
        state = None
    lag = _lag_after(resource, shard, end)
    if lag is not None:
        metadata["lag"] = dg.MetadataValue.int(lag)
    for key, value in extra.items():
        metadata[str(key)] = value
    checks = [lag_check_result(asset_key, shard, lag, resource.lag_alert_records)]
    if state is None:
        state, _ = resource.store().load(resource.state_key())
    checks.append(parked_check_result(asset_key, state))
    return dg.MaterializeResult(metadata=metadata, check_results=checks)


def _lag_after(resource: StreamGroupResource, shard: str, end: int) -> int | None:
    try:
        high = resource.backend().watermarks([shard])[shard].high
    except StreamError:
        return None
    return max(0, high - end)
