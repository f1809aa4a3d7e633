"""The stream asset: a run reads its offset ranges as one DataFrame, calls user code once, then commits.

Partitions are shards. A member's run holds one range of each of its ready shards (the run config lists
them), so the fixed costs of a run (launch, process, Spark session, query planning) are paid once per batch
of ranges, not once per range. The commit is the fenced transition of all the run's ranges in one state
write (refused whole if any shard moved to another member or epoch), then the offsets are mirrored into the
backend, then each range is recorded as a materialization of its shard partition. Everything that could
make the run fail after its commit (metadata Dagster rejects, for example) is checked before the commit, so a
committed range always gets its materialization. A run without a member (a backfill) re-processes its
ranges and commits nothing.

With ``carry_on_s``, a run's commit also takes its shards' next ranges, in the same state write
(``protocol.commit_and_carry_on``), and the run processes them as its next wave: one Dagster run and one Spark
session over several waves. A wave's Spark work starts as soon as the previous wave is committed, while Dagster
stores that wave's materializations (a database transaction each, about a fifth of a second for a wave of ten
shards: time the Spark server would otherwise spend idle); it is committed only after them, so each shard's
materializations stay in offset order, and a wave that fails is raised once the committed one's are stored. A
run whose shards are caught up at a commit ends there; one whose shards hold fewer than ``min_backlog`` records
waits for more, up to ``max_wait_s``.
"""

import contextlib
import functools
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextvars import ContextVar, copy_context
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import dagster as dg

from dagster_streamgroup.dagster import tags as sgt
from dagster_streamgroup.dagster.backfill import backfill_key, run_backfill
from dagster_streamgroup.dagster.checks import (
    LAG_CHECK,
    PARKED_CHECK,
    check_specs,
    lag_check_result,
    parked_check_result,
)
from dagster_streamgroup.dagster.liveness import RunHeartbeat, run_beat_interval_s
from dagster_streamgroup.dagster.range_index import record_committed_ranges
from dagster_streamgroup.dagster.recorded import materialized_for
from dagster_streamgroup.dagster.resources import DAEMON_LOOP_S, KafkaStreamGroup, StreamGroupResource
from dagster_streamgroup.dagster.typed import RunDecoding, run_decoding
from dagster_streamgroup.formats.spark import DecodedRecords, DecodeOutcome, DecodeParkError, registry_unavailable
from dagster_streamgroup.member import ContentionError, DeadRecords, GroupMember
from dagster_streamgroup.protocol import DeadRecord, GroupState, Launch, RangeReport, report_of
from dagster_streamgroup.protocol.completion import FailOutcome
from dagster_streamgroup.sinks.base import RangeSink, SinkRun
from dagster_streamgroup.streams.base import StreamError, Watermarks, seconds_behind

PARENT_RUN_ID_TAG = "dagster/parent_run_id"
"""Set by Dagster on a re-execution and on its automatic run retries, with the parent run's tags copied."""

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from dagster_streamgroup.formats.config import ReaderSpec

StreamFn = Callable[[dg.AssetExecutionContext, "DataFrame"], "Mapping[str, Any] | DataFrame | None"]
"""The user's function: processes a run's DataFrame (every range of the run) idempotently per range, may
return extra metadata, which each range's materialization carries; with a declared sink, returns the rows the
sink commits (a DataFrame) instead."""

TAG_SINK = sgt.PREFIX + "sink"
"""Asset metadata: the declared sink's kind (``delta``, ``kafka``, ``parquet_ranges``)."""
TAG_REPLACES_BY_COORDINATES = sgt.ASSET_REPLACES_BY_COORDINATES
"""Asset metadata: whether the declared sink replaces rows by their source coordinates, so that a backfill of
any range, aligned with the committed ranges or not, replaces exactly its records' rows."""

MAX_REASON = 2000

_WAVE: ContextVar[list[sgt.RangeSpec] | None] = ContextVar("streamgroup_wave", default=None)
"""The ranges the stream function is processing, while it is called: a run that carried on reads ranges its run
config does not name."""


class CommitRefusedError(dg.Failure):
    """The group refused the commit: a shard moved to another member or epoch while the run ran."""


@dataclass(frozen=True)
class StreamRange:
    """One offset range of a run: the records ``start <= offset < end`` of ``shard``."""

    shard: str
    start: int
    end: int

    @property
    def records(self) -> int:
        """Offsets in the range (Kafka transaction markers and compaction can make the records fewer)."""
        return self.end - self.start


def run_ranges_of(context: dg.AssetExecutionContext) -> list[sgt.RangeSpec]:
    """The ranges a run processes: its run config, or for a backfill of shard partitions, their partition keys
    with the offset range of the backfill's tags; while the stream function runs, those of the current wave."""
    wave = _WAVE.get()
    if wave is not None:
        return list(wave)
    raw = context.op_execution_context.op_config or {}
    config = sgt.StreamRunConfig.model_validate(raw)
    if config.ranges:
        sgt.check_ranges(config.ranges)
        return list(config.ranges)
    keys = context.partition_keys if context.has_partition_key_range or context.has_partition_key else []
    if not keys:
        raise sgt.RangeTagsError(
            "this run names no offset ranges: stream asset runs are launched by the group's member sensors, or as "
            f"backfills of shard partitions with the tags {sgt.TAG_START} and {sgt.TAG_END}, or from the "
            "Launchpad with ranges in the run config"
        )
    return sgt.ranges_from_backfill_tags(keys, context.run.tags)


def ranges_of(context: dg.AssetExecutionContext) -> list[StreamRange]:
    """The ranges of this run, in shard and offset order: what the DataFrame given to the stream function holds (a
    member's run holds one range of each of its shards; a backfill's wave, many consecutive ranges of one shard)."""
    ranges = (StreamRange(r.shard, r.start, r.end) for r in run_ranges_of(context))
    return sorted(ranges, key=lambda r: (r.shard, r.start))


def range_of(context: dg.AssetExecutionContext) -> tuple[str, int, int]:
    """``(shard, start, end)`` of a run that holds exactly one range (``run_mode='shard'``, a retry, a
    one-shard backfill); a run over several ranges raises: use ``ranges_of``."""
    ranges = ranges_of(context)
    if len(ranges) != 1:
        raise dg.Failure(
            f"range_of: this run holds {len(ranges)} ranges ({', '.join(r.shard for r in ranges)}); "
            "use ranges_of(context), or run_mode='shard' for one range per run"
        )
    only = ranges[0]
    return only.shard, only.start, only.end


_SPEC_FIELDS = frozenset(("deps", "code_version", "automation_condition", "owners", "tags"))
"""``stream_asset`` keywords that describe the asset (its ``AssetSpec``); the others go to ``dg.multi_asset``."""
_BACKFILL_SPEC_FIELDS = frozenset(("code_version", "owners", "tags"))
"""... and those its backfill asset shares."""

_BACKFILL_ASSETS: weakref.WeakKeyDictionary[object, dg.AssetsDefinition] = weakref.WeakKeyDictionary()
"""The backfill asset of each stream asset, by the stream asset's op (which copies of its definition share)."""


def backfill_asset_of(asset: dg.AssetsDefinition) -> dg.AssetsDefinition | None:
    """The backfill asset ``stream_asset`` built beside ``asset`` (``<name>_backfill``): its runs re-process ranges
    without moving the stream asset's latest materialization, lag or freshness (``dagster/backfill.py``). The member
    sensors target it with the stream asset, so a code location with the sensors has it."""
    return _BACKFILL_ASSETS.get(asset.node_def)


FRESHNESS_MARGIN_S = 60.0
"""What a run takes beyond the group's own waits (queueing, a process, a Spark session, the read, the commit)."""

FRESHNESS_FLOOR_S = 60.0
"""Dagster refuses a freshness window shorter than a minute (``TimeWindowFreshnessPolicy``)."""


def freshness_windows(
    max_wait_s: float, heartbeat_interval_s: float, margin_s: float = FRESHNESS_MARGIN_S
) -> tuple[timedelta, timedelta]:
    """(warn, fail) after the latest materialization: a waiting backlog is launched once it has waited
    ``max_wait_s``, at the member's next tick (every heartbeat, and every 5 s at the fastest, as Dagster's daemon
    ticks sensors), so a group that works materializes within ``max_wait_s`` + 2 ticks + what a run takes
    (``margin_s``), and at least every minute's window Dagster allows; it fails at twice the warning."""
    if max_wait_s < 0 or heartbeat_interval_s <= 0 or margin_s < 0:
        raise ValueError(
            f"freshness: max_wait_s ({max_wait_s:g}) and margin_s ({margin_s:g}) must be >= 0 and "
            f"heartbeat_interval_s ({heartbeat_interval_s:g}) > 0"
        )
    warn = max(FRESHNESS_FLOOR_S, max_wait_s + 2 * max(heartbeat_interval_s, DAEMON_LOOP_S) + margin_s)
    return timedelta(seconds=warn), timedelta(seconds=2 * warn)


def stream_freshness_policy(group: StreamGroupResource, *, margin_s: float = FRESHNESS_MARGIN_S) -> dg.FreshnessPolicy:
    """A Dagster ``FreshnessPolicy`` from ``group``'s latency settings (``freshness_windows``), for
    ``stream_asset(..., freshness_policy=...)``: Dagster's freshness daemon then marks the asset WARN, then FAIL,
    when the group stops materializing.

    Opt-in, because Dagster judges freshness by the asset's latest materialization of any partition: a stream
    that carries nothing (zero lag, nothing to commit) goes stale as surely as a group whose members stopped. Use it
    on streams that always carry records, or read WARN/FAIL as "nothing processed for that long"."""
    warn, fail = freshness_windows(group.max_wait_s, group.heartbeat_interval_s, margin_s)
    return dg.FreshnessPolicy.time_window(fail_window=fail, warn_window=warn)


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
    freshness_policy: dg.FreshnessPolicy | None = None,
    value_schema: "ReaderSpec | None" = None,
    key_schema: "ReaderSpec | None" = None,
    sink: RangeSink | None = None,
    replaces_by_coordinates: bool = False,
    **asset_kwargs: Any,
) -> Callable[[StreamFn], dg.AssetsDefinition]:
    """Turn ``fn(context, df) -> metadata | None`` into the stream asset of consumer group ``group``.

    ``df`` holds every range of the run (``ranges_of(context)`` lists them; the shard columns, ``topic`` and
    ``partition`` for Kafka, ``shard`` for v3io, tell their rows apart). ``resource_key`` names a
    ``StreamGroupResource`` (e.g. ``KafkaStreamGroup``) whose ``group`` is ``group``; ``spark_resource_key`` a
    dagster-pyspark resource (``StreamSparkResource``). ``freshness_policy``: none by default (an idle stream
    would go stale); ``stream_freshness_policy(group_resource)`` derives one from the group's latency settings.
    ``value_schema`` / ``key_schema`` (typed records, the resource's ``value_format``): the reader schema the
    DataFrame's ``value`` / ``key`` columns take for the whole run, ``latest`` (the subject's latest version at the
    run's start, the default), a version number, or a schema (Avro or JSON Schema, as JSON text or a dict).
    ``sink``: where the run's rows go (``dagster_streamgroup.sinks``: a Delta table, a Kafka topic, Parquet range
    folders); the function then returns its rows as a DataFrame, which the run commits into the sink before it
    commits its ranges into the group state. The asset's metadata names the sink's kind and whether it replaces
    rows by their source coordinates (``sink_replaces_by_coordinates``).
    ``replaces_by_coordinates``: for a function that writes its output itself, that its sink replaces rows by their
    source coordinates (shard and offset, as a table merged on them does), so a backfill of any bounds replaces
    exactly its records: backfills then cut their range in pieces instead of following the committed ranges, and
    may reach past the group's committed offset (a sink keyed by range, as the example's folders are, needs
    neither: the default). A declared ``sink`` says it itself. Other keywords describe the asset (``owners``,
    ``tags``, ``code_version``, ``deps``, ``automation_condition``) or its op (``op_tags``, ``retry_policy``,
    ``pool``, ...), as ``dg.AssetSpec`` and ``dg.multi_asset`` take them.

    Beside it, ``<name>_backfill`` (``backfill_asset_of``) re-processes ranges for backfills, with the same
    function and sink."""

    if sink is not None and replaces_by_coordinates and not sink.replaces_by_coordinates:
        raise ValueError(
            f"replaces_by_coordinates=True: the declared sink ({type(sink).__name__}) does not replace rows by their "
            "source coordinates; leave the flag out (a declared sink says it itself)"
        )
    replaces = replaces_by_coordinates or (sink is not None and sink.replaces_by_coordinates)

    def decorate(fn: StreamFn) -> dg.AssetsDefinition:
        asset_name = name or fn.__name__
        prefix = [key_prefix] if isinstance(key_prefix, str) else list(key_prefix or [])
        asset_key = dg.AssetKey([*prefix, asset_name])
        partitions = dg.DynamicPartitionsDefinition(name=sgt.partitions_def_name(group))

        # A multi-asset of one asset, so that a run may leave the asset's checks out: a member's run plans none
        # (its member's ticks evaluate them, checks.py), which a plain @asset with check specs cannot subset.
        spec_kwargs = {k: v for k, v in asset_kwargs.items() if k in _SPEC_FIELDS}
        op_kwargs = {k: v for k, v in asset_kwargs.items() if k not in _SPEC_FIELDS}

        @dg.multi_asset(
            name=asset_key.to_python_identifier(),
            specs=[
                dg.AssetSpec(
                    key=asset_key,
                    partitions_def=partitions,
                    skippable=True,
                    metadata={
                        sgt.TAG_GROUP: group,
                        sgt.PREFIX + "resource_key": resource_key,
                        sgt.PREFIX + "spark_resource_key": spark_resource_key,
                        **_sink_metadata(sink),
                        **({sgt.ASSET_REPLACES_BY_COORDINATES: True} if replaces else {}),
                    },
                    description=description or fn.__doc__ or f"Offset ranges of consumer group {group!r}.",
                    group_name=group_name,
                    kinds=kinds or {"spark"},
                    freshness_policy=freshness_policy,
                    **spec_kwargs,
                )
            ],
            check_specs=check_specs(asset_key),
            can_subset=True,
            required_resource_keys={resource_key, spark_resource_key},
            **op_kwargs,
        )
        def _stream_asset(
            context: dg.AssetExecutionContext, config: sgt.StreamRunConfig
        ) -> Iterator[dg.AssetMaterialization | dg.AssetCheckResult]:
            resource: StreamGroupResource = getattr(context.resources, resource_key)
            if resource.group != group:
                raise dg.Failure(f"resource {resource_key!r} is group {resource.group!r}, the asset needs {group!r}")
            spark_resource = getattr(context.resources, spark_resource_key)
            decoding = run_decoding(resource, value_schema, key_schema)
            yield from run_ranges(context, config, resource, spark_resource, fn, asset_key, decoding, sink)

        assert isinstance(_stream_asset, dg.AssetsDefinition)
        key = backfill_key(asset_key)

        @dg.multi_asset(
            name=key.to_python_identifier(),
            specs=[
                dg.AssetSpec(
                    key=key,
                    partitions_def=partitions,
                    skippable=True,
                    # Not the stream asset's group tag: what looks a group's stream asset up finds one asset.
                    metadata={sgt.ASSET_BACKFILL_OF: asset_key.to_user_string(), sgt.PREFIX + "backfill_group": group},
                    description=f"Backfills of {asset_key.to_user_string()}: each materialization re-processed "
                    "committed ranges of one shard (its metadata gives the offsets) into the same output. Nothing is "
                    f"committed here; the group's progress, lag and freshness are {asset_key.to_user_string()}'s.",
                    group_name=group_name,
                    kinds=kinds or {"spark"},
                    **{k: v for k, v in spec_kwargs.items() if k in _BACKFILL_SPEC_FIELDS},
                )
            ],
            required_resource_keys={resource_key, spark_resource_key},
            **op_kwargs,
        )
        def _backfill(
            context: dg.AssetExecutionContext, config: sgt.StreamRunConfig
        ) -> Iterator[dg.AssetMaterialization]:
            resource: StreamGroupResource = getattr(context.resources, resource_key)
            if resource.group != group:
                raise dg.Failure(f"resource {resource_key!r} is group {resource.group!r}, the asset needs {group!r}")
            spark_resource = getattr(context.resources, spark_resource_key)

            decoding = run_decoding(resource, value_schema, key_schema)

            def process(ranges: list[sgt.RangeSpec], read: dict[str, tuple[int, int]]) -> _ProcessedWave:
                return _process(
                    context, resource, spark_resource, fn, key, ranges, None, None,
                    decoding=decoding, sink=sink, config=config, read=read,
                )  # fmt: skip

            yield from run_backfill(
                context,
                config,
                resource,
                stream_key=asset_key,
                replaces_by_coordinates=replaces,
                process=process,
            )

        assert isinstance(_backfill, dg.AssetsDefinition)
        _BACKFILL_ASSETS[_stream_asset.node_def] = _backfill
        return _stream_asset

    return decorate


def _refuse_copies(context: dg.AssetExecutionContext, reports: Sequence[RangeReport] | None) -> None:
    parent_run_id = context.run.parent_run_id or context.run.tags.get(PARENT_RUN_ID_TAG)
    if reports and parent_run_id is not None:
        # Re-execution and Dagster's run retries copy the config and tags of the parent run. The group retries
        # a failed range itself, as a new attempt from its sensor, and only that run may commit: a copy would
        # process the ranges again and then have its commit refused.
        raise dg.Failure(
            description=f"run {context.run.run_id} re-executes member run {parent_run_id} ({_describe(reports)}). The "
            "group retries failed ranges itself, as new attempts launched by its member sensors, and only those "
            "runs commit. To re-process ranges without moving offsets, backfill them (`streamgroup backfill`, a "
            f"UI backfill of the shard partitions with tags {sgt.TAG_START}/{sgt.TAG_END}, or the Launchpad)."
        )


def _describe(ranges: Sequence[RangeReport | sgt.RangeSpec]) -> str:
    return ", ".join(f"{r.shard} [{r.start}, {r.end})" for r in ranges)


def ranges_table(ranges: Sequence[sgt.RangeSpec]) -> str:
    """The run's ranges as an aligned table (shard, start, end, records, attempt): the run page shows it in the
    run's first log message, where the runs list no longer carries a tag per figure."""
    rows = [("shard", "start", "end", "records", "attempt")]
    rows += [(r.shard, str(r.start), str(r.end), str(r.end - r.start), str(r.attempt)) for r in ranges]
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    return "\n".join(
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    )


def run_ranges(
    context: dg.AssetExecutionContext,
    config: sgt.StreamRunConfig,
    resource: StreamGroupResource,
    spark_resource: Any,
    fn: StreamFn,
    asset_key: dg.AssetKey,
    decoding: RunDecoding | None = None,
    sink: RangeSink | None = None,
) -> Iterator[dg.AssetMaterialization | dg.AssetCheckResult]:
    reports = sgt.member_reports(config, resource.group, context.run.tags)
    if reports is None:
        # Its materializations would become the shards' latest (their lag and committed offset) and the asset's
        # freshness: re-processing is the backfill asset's (dagster/backfill.py).
        raise dg.Failure(
            description=f"a run of {asset_key.to_user_string()} is a member's run of group {resource.group!r}; to "
            f"re-process ranges without moving offsets, backfill {backfill_key(asset_key).to_user_string()} "
            f"(`streamgroup backfill`, a UI backfill of its shard partitions with tags {sgt.TAG_START}/{sgt.TAG_END}, "
            "or its Launchpad with ranges in the run config)"
        )
    ranges = run_ranges_of(context)
    _refuse_copies(context, reports)
    member = resource.member(config.member) if reports and config.member is not None else None
    mode = "backfill (nothing is committed)" if member is None else f"member {config.member}, run {config.run_key}"
    context.log.info(
        f"{resource.group}: {len(ranges)} range(s), {sum(r.end - r.start for r in ranges)} record(s), as {mode}:\n"
        + ranges_table(ranges)
    )

    heartbeat = (
        RunHeartbeat(member, reports, run_beat_interval_s(resource.heartbeat_interval_s, resource.session_timeout_s))
        if member is not None and reports
        else None
    )
    carry_until = (
        time.monotonic() + resource.carry_on_s if member is not None and resource.run_mode == "member" else 0.0
    )
    wave = 0

    def process(ranges: list[sgt.RangeSpec], reports: list[RangeReport] | None) -> _ProcessedWave:
        return _process(
            context, resource, spark_resource, fn, asset_key, ranges, reports, member, decoding, sink, config
        )

    def carry_on(launches: Sequence[Launch]) -> tuple[list[sgt.RangeSpec], list[RangeReport]]:
        nonlocal wave
        wave += 1
        ranges = [
            sgt.RangeSpec(shard=x.shard, start=x.start, end=x.end, attempt=x.attempt, epoch=x.epoch) for x in launches
        ]
        reports = [report_of(x) for x in launches]
        assert heartbeat is not None
        heartbeat.follow(reports)
        context.log.info(f"{resource.group}: carries on with wave {wave}: {_describe(ranges)}")
        return ranges, reports

    with heartbeat or contextlib.nullcontext():
        processed = process(ranges, reports)
        while True:
            committed = _commit(context, resource, ranges, reports, member, carry_until, processed)
            marks, state, last = committed.marks, committed.state, ranges
            if wave == 0:  # a later wave holds shards of the first (a run carries on only with its own)
                _ensure_partitions(context, [r.shard for r in ranges])
            materializations = _materializations(config, resource, asset_key, last, wave, processed, committed)
            materializations = _not_recorded_yet(context, asset_key, config, last, committed, materializations)
            if committed.launches:
                ranges, reports = carry_on(committed.launches)
                next_wave = _read_ahead(functools.partial(process, ranges, reports))
                # The next wave is read while Dagster stores these (a SQLite or PostgreSQL transaction each);
                # it is committed only after them, so a shard's materializations stay in offset order.
                yield from materializations
                processed = next_wave.result()  # its failure is raised once these are stored
                continue
            yield from materializations
            if not committed.carrying or member is None or config.run_key is None:
                break
            if not _records_wait(last, marks):
                context.log.info(f"{resource.group}: its shards are caught up, the run ends")
                break
            launches = _wait_for_a_wave(resource, member, config.run_key, list(marks), carry_until)
            if not launches:
                break
            ranges, reports = carry_on(launches)
            processed = process(ranges, reports)
    # A member's run plans no check (its member's ticks evaluate them); a backfill or a hand-launched run does.
    selected = context.selected_asset_check_keys
    if dg.AssetCheckKey(asset_key, LAG_CHECK) in selected:
        lags = {r.shard: max(0, marks[r.shard].written_end - r.end) for r in last if r.shard in marks}
        behind = _seconds_behind(resource, last, marks)
        yield lag_check_result(asset_key, lags, resource.lag_alert_records, behind, resource.lag_alert_seconds)
    if dg.AssetCheckKey(asset_key, PARKED_CHECK) in selected:
        if state is None:
            state, _ = resource.store().load(resource.state_key())
        yield parked_check_result(asset_key, state)


@dataclass(frozen=True)
class _ProcessedWave:
    """What a wave's Spark work left for its materializations."""

    records: dict[str, int]
    user_metadata: dict[str, dg.MetadataValue]
    session_s: float
    process_s: float
    decode: DecodeOutcome | None = None
    """Typed records: what became of each shard's records (decoded, dead-lettered, nulled)."""


@dataclass(frozen=True)
class _CommittedWave:
    """What a wave's commit left: the watermarks read for it (none when the stream did not answer), the state it
    wrote (none for a backfill), whether the offsets reached the backend, whether it planned the next wave, and
    that wave's ranges (whatever it found to plan)."""

    marks: dict[str, Watermarks]
    state: GroupState | None
    mirrored: bool
    carrying: bool
    launches: list[Launch]
    already_committed: frozenset[str] = frozenset()
    """Shards whose range the group found committed by this run already (see ``_not_recorded_yet``)."""


def _read_ahead(work: Callable[[], _ProcessedWave]) -> Future[_ProcessedWave]:
    """``work`` in a thread of its own, with this context's variables (Dagster's and ``_WAVE``). A daemon thread:
    a run interrupted meanwhile ends without waiting for it, and its ranges are retried as any failed run's."""
    future: Future[_ProcessedWave] = Future()

    def run() -> None:
        future.set_running_or_notify_cancel()
        try:
            future.set_result(work())
        except BaseException as exc:  # handed to the run's thread, which raises it
            future.set_exception(exc)

    threading.Thread(target=copy_context().run, args=(run,), name="streamgroup-next-wave", daemon=True).start()
    return future


def _process(
    context: dg.AssetExecutionContext,
    resource: StreamGroupResource,
    spark_resource: Any,
    fn: StreamFn,
    asset_key: dg.AssetKey,
    ranges: list[sgt.RangeSpec],
    reports: list[RangeReport] | None,
    member: GroupMember | None,
    decoding: RunDecoding | None = None,
    sink: RangeSink | None = None,
    config: sgt.StreamRunConfig | None = None,
    read: dict[str, tuple[int, int]] | None = None,
) -> _ProcessedWave:
    """A wave's Spark work: read its ranges (``read``: the spans a backfill's wave reads, many ranges of a shard in
    one), call the stream function, commit its rows into the declared sink, count the records. On failure the
    ranges are reported failed (retried by the group) before the error is raised, so a sink commit is always
    followed by the state commit or by a retry of the same ranges: a registry that could not be asked retries
    them with their bounds without counting an attempt, records that a retry would meet again (a writer schema
    the reader cannot resolve, a bad record under ``on_decode_error: fail``) park their range at once."""
    try:
        t0 = time.monotonic()
        spark = spark_resource.spark_session
        session_s = time.monotonic() - t0
        t1 = time.monotonic()
        if decoding is not None and not decoding.resolved:
            context.log.info(f"{resource.group}: decodes {decoding.describe()}")
        observed = resource.observed_records(spark, read or {r.shard: (r.start, r.end) for r in ranges}, decoding)
        token = _WAVE.set(list(ranges))
        try:
            out = fn(context, observed.df)
        finally:
            _WAVE.reset(token)
        extra = _sink_output(context, resource, sink, out, ranges, config)
        process_s = time.monotonic() - t1
        records = observed.counts()
        decode = observed.settle() if isinstance(observed, DecodedRecords) else None
        # Checked now, not after the commit: a commit must never be left without its materialization.
        user_metadata = _checked_metadata(asset_key, extra)
    except Exception as exc:
        if member is not None and reports:
            reason = f"{type(exc).__name__}: {exc}"[:MAX_REASON]
            if isinstance(exc, DecodeParkError):
                outcomes = member.park_run(reports, exc.parked)
            elif registry_unavailable(exc):
                member.launch_failed(reports, reason)
                outcomes = dict.fromkeys((r.shard for r in reports), FailOutcome.RETRY)
            else:
                outcomes = member.fail_run(reports, reason)
            summary = ", ".join(f"{shard} {outcome.value}" for shard, outcome in outcomes.items())
            context.log.error(f"{_describe(reports)} failed ({summary}): {reason}")
        raise
    return _ProcessedWave(records, user_metadata, session_s, process_s, decode)


def _commit(
    context: dg.AssetExecutionContext,
    resource: StreamGroupResource,
    ranges: list[sgt.RangeSpec],
    reports: list[RangeReport] | None,
    member: GroupMember | None,
    carry_until: float,
    processed: _ProcessedWave | None = None,
) -> _CommittedWave:
    """A processed wave's commit (nothing for a backfill), then its offsets mirrored into the backend and its ranges'
    bounds recorded (``range_index``). Before ``carry_until`` the commit also plans the shards' next wave, in the same
    state write (``protocol.commit_and_carry_on``), with their watermarks read just before it."""
    state: GroupState | None = None
    mirrored = True
    shards = [r.shard for r in ranges]
    carrying = member is not None and bool(reports) and time.monotonic() < carry_until
    marks = _watermarks(resource, shards) if carrying else {}
    carrying = carrying and bool(marks)
    launches: list[Launch] = []
    already: frozenset[str] = frozenset()
    if member is not None and reports:
        dead = _dead_records(processed.decode if processed is not None else None)
        if carrying:
            outcome, stats, launches = member.commit_run_and_carry_on(reports, marks, dead)
        else:
            outcome, stats = member.commit_run_state_only(reports, dead)
        if not outcome.accepted:
            refusals = outcome.refusals
            raise CommitRefusedError(
                description=f"commit refused: {outcome.message}",
                metadata={
                    "refused_shards": ", ".join(sorted(refusals)),
                    "refusals": "; ".join(f"{s}: {o.refusal}" for s, o in sorted(refusals.items())),
                },
            )
        already = frozenset(r.shard for r in reports if outcome.outcomes[r.shard].already_committed)
        fresh = {r.shard: r.end for r in reports if r.shard not in already}
        if fresh:
            try:
                member.mirror(fresh, stats.state)
            except StreamError as exc:
                # The group state holds the commit; the next commit mirrors a later offset.
                mirrored = False
                context.log.warning(f"committed in the group state, mirroring to the stream failed: {exc}")
        state = stats.state
    if not marks:
        marks = _watermarks(resource, shards)
    if member is not None and reports:
        # Before the materializations: a run that dies in between is repaired by its member, which records them.
        record_committed_ranges(resource, [(r.shard, r.start, r.end) for r in reports], marks)
    return _CommittedWave(marks, state, mirrored, carrying, launches, already)


def _dead_records(decode: DecodeOutcome | None) -> dict[str, DeadRecords] | None:
    """The dead letters of a wave's undecodable records, for its commit."""
    if decode is None:
        return None
    out = {}
    for shard, outcome in decode.shards.items():
        if outcome.dead_lettered:
            first = outcome.dead_records[0] if outcome.dead_records else None
            reason = f"{outcome.dead_lettered} of {outcome.records} records could not be decoded (on_decode_error: " + (
                f"dead_letter); the first, at offset {first.offset}: {first.error}" if first else "dead_letter)"
            )
            records = tuple(DeadRecord(r.offset, r.error, r.key, r.value) for r in outcome.dead_records)
            out[shard] = DeadRecords(outcome.dead_lettered, records, reason[:MAX_REASON])
    return out or None


def _seconds_behind(
    resource: StreamGroupResource, ranges: Sequence[sgt.RangeSpec], marks: Mapping[str, Watermarks]
) -> dict[str, float]:
    """Each range's shard's seconds behind at the range's end: one request over the shards with records past
    their range's end, none when every shard is caught up. Its failure costs the figure, never the run."""
    try:
        return seconds_behind(resource.backend(), {r.shard: r.end for r in ranges}, marks)
    except StreamError:
        return {}


def _materializations(
    config: sgt.StreamRunConfig,
    resource: StreamGroupResource,
    asset_key: dg.AssetKey,
    ranges: list[sgt.RangeSpec],
    wave: int,
    processed: _ProcessedWave,
    committed: _CommittedWave,
) -> list[dg.AssetMaterialization]:
    """One materialization of each range of a wave, on its shard partition, with what the wave measured."""
    marks, records = committed.marks, processed.records
    lags = {r.shard: max(0, marks[r.shard].written_end - r.end) for r in ranges if r.shard in marks}
    behind = _seconds_behind(resource, ranges, marks)
    total = sum(records.values())
    out = []
    for spec in ranges:
        metadata: dict[str, dg.RawMetadataValue] = {
            "group": dg.MetadataValue.text(resource.group),
            "shard": dg.MetadataValue.text(spec.shard),
            "start": dg.MetadataValue.int(spec.start),
            "end": dg.MetadataValue.int(spec.end),
            "records": dg.MetadataValue.int(records.get(spec.shard, 0)),
            "run_ranges": dg.MetadataValue.int(len(ranges)),
            "run_records": dg.MetadataValue.int(total),
            "session_s": dg.MetadataValue.float(round(processed.session_s, 3)),
            "process_s": dg.MetadataValue.float(round(processed.process_s, 3)),
            "wave": dg.MetadataValue.int(wave),
        }
        if committed.state is not None:
            metadata.update(
                {
                    "epoch": dg.MetadataValue.int(spec.epoch),
                    "member": dg.MetadataValue.text(str(config.member)),
                    "committed": dg.MetadataValue.int(spec.end),
                    "mirrored": dg.MetadataValue.bool(committed.mirrored),
                    "attempt": dg.MetadataValue.int(spec.attempt),
                    "run_key": dg.MetadataValue.text(str(config.run_key)),
                }
            )
        else:
            metadata["backfill"] = dg.MetadataValue.bool(True)
        lag = lags.get(spec.shard)
        if lag is not None:
            metadata["lag"] = dg.MetadataValue.int(lag)
        if spec.shard in behind:
            metadata["seconds_behind"] = dg.MetadataValue.float(round(behind[spec.shard], 3))
        decoded = processed.decode.shards.get(spec.shard) if processed.decode is not None else None
        if decoded is not None:
            metadata["decoded"] = dg.MetadataValue.int(decoded.decoded)
            metadata["dead_lettered"] = dg.MetadataValue.int(decoded.dead_lettered)
            metadata["nulled"] = dg.MetadataValue.int(decoded.nulled)
        metadata.update(processed.user_metadata)
        out.append(dg.AssetMaterialization(asset_key=asset_key, partition=spec.shard, metadata=metadata))
    return out


def _not_recorded_yet(
    context: dg.AssetExecutionContext,
    asset_key: dg.AssetKey,
    config: sgt.StreamRunConfig,
    ranges: Sequence[sgt.RangeSpec],
    committed: _CommittedWave,
    materializations: list[dg.AssetMaterialization],
) -> list[dg.AssetMaterialization]:
    """The wave's materializations less those of ranges recorded already. The group accepts a commit of this
    run's key again as made (a write whose answer was lost is retried, and finds it made), and so it does for a
    second execution of the same run (two workers of one run, a copy of the run); a range is recorded once, so one
    whose commit was found made and whose materialization Dagster holds (``recorded.materialized_for``) is not
    recorded again. The group found the range to be its shard's last commit, so its record, if there is one, is
    among the shard's newest: one page of them is looked at."""
    if not committed.already_committed or config.run_key is None:
        return materializations
    kept = []
    for spec, materialization in zip(ranges, materializations, strict=True):
        shard_range = (spec.shard, spec.start, spec.end)
        if spec.shard in committed.already_committed and materialized_for(
            context.instance, asset_key, config.run_key, shard_range, pages=1
        ):
            context.log.warning(
                f"{spec.shard} [{spec.start}, {spec.end}) was committed and recorded already, by another execution "
                f"of run {config.run_key}: it is not recorded again"
            )
            continue
        kept.append(materialization)
    return kept


def _records_wait(ranges: Sequence[sgt.RangeSpec], marks: Mapping[str, Watermarks]) -> bool:
    """Whether a record was written past a wave's ranges when its commit read the watermarks. A run whose shards
    are caught up ends instead of waiting ``max_wait_s`` for records that may not come: its member's ticks plan
    the shards' next ranges when they do, and a quiet stream holds no run, process or Spark session meanwhile."""
    return any(marks[r.shard].written_end > r.end for r in ranges if r.shard in marks)


CARRY_ON_POLL_S = 1.0
"""How often a run that committed looks for its next wave's records while fewer than ``min_backlog`` wait."""


def _wait_for_a_wave(
    resource: StreamGroupResource, member: GroupMember, run_key: str, shards: Sequence[str], carry_until: float
) -> list[Launch]:
    """The next wave of a run whose commit found fewer than ``min_backlog`` records to plan: planned as soon as they
    wait, or once they have waited ``max_wait_s`` (as the member's tick would plan them, which the run's more
    frequent look usually beats), within ``carry_on_s``. None when that passes with nothing to read, or the shards
    moved on (a tick planned them first, a rebalance handed them over, the member left)."""
    # The last look is at the deadline, a poll after max_wait_s: however long the looks before it took, it comes
    # after the records waited max_wait_s since the commit that saw them, so they are planned.
    deadline = min(carry_until, time.monotonic() + resource.max_wait_s + CARRY_ON_POLL_S)
    while (pause := min(CARRY_ON_POLL_S, deadline - time.monotonic())) > 0:
        time.sleep(pause)
        marks = _watermarks(resource, shards)
        if not marks:
            continue
        try:
            launches, state = member.carry_on(run_key, shards, marks)
        except ContentionError:
            return []  # the state kept changing under the run: its member's ticks plan the shards' next ranges
        if launches:
            return launches
        if state is None or not any(
            (shard := state.shards.get(s)) is not None
            and shard.owner == member.member_id
            and shard.inflight is None
            and shard.parked is None
            and shard.lease is None
            for s in shards
        ):
            return []
    return []


def _sink_metadata(sink: RangeSink | None) -> dict[str, Any]:
    if sink is None:
        return {}
    return {
        TAG_SINK: str(getattr(sink, "kind", type(sink).__name__)),
        TAG_REPLACES_BY_COORDINATES: sink.replaces_by_coordinates,
    }


def sink_replaces_by_coordinates(asset: dg.AssetsDefinition) -> bool:
    """Whether the stream asset declares a sink that replaces rows by their source coordinates (a Delta table):
    a backfill of any offsets then replaces exactly their rows, so it need not align with the committed ranges,
    and may run ahead of the group."""
    return any(meta.get(TAG_REPLACES_BY_COORDINATES) is True for meta in asset.metadata_by_key.values())


def _sink_output(
    context: dg.AssetExecutionContext,
    resource: StreamGroupResource,
    sink: RangeSink | None,
    out: Any,
    ranges: Sequence[sgt.RangeSpec],
    config: sgt.StreamRunConfig | None,
) -> Mapping[str, Any]:
    """The stream function's metadata: what it returned, or, with a declared sink, what the sink's commit of the
    rows it returned reports."""
    if sink is None:
        if out is None or isinstance(out, Mapping):
            return out or {}
        raise dg.Failure(
            description=f"the stream function returned a {type(out).__name__}, and the asset declares no sink to "
            "write it to: return metadata (a dict), or declare stream_asset(..., sink=...)"
        )
    if out is None or isinstance(out, Mapping):
        raise dg.Failure(
            description=f"the asset declares a {getattr(sink, 'kind', 'sink')} sink ({sink.target()}), and the stream "
            "function returned no rows for it: return the DataFrame to write (its rows keep their source columns)"
        )
    run = SinkRun(
        group=resource.group,
        member=config.member if config is not None else None,
        run_key=config.run_key if config is not None else None,
        kafka_client=resource.stream_config().client_config if isinstance(resource, KafkaStreamGroup) else None,
    )
    result = sink.write(out, ranges, run)
    context.log.info(
        f"{sink.target()}: {'' if result.rows is None else f'{result.rows} row(s) of '}{result.ranges} range(s) "
        f"committed in {result.seconds:.2f} s"
        + (f", {result.skipped_ranges} range(s) found written already" if result.skipped_ranges else "")
        + (f", {result.conflicts} conflict(s) retried" if result.conflicts else "")
    )
    return result.metadata()


def _checked_metadata(asset_key: dg.AssetKey, extra: Mapping[str, Any]) -> dict[str, dg.MetadataValue]:
    """The user's metadata as Dagster will store it; raises now on a value Dagster rejects."""
    try:
        return dict(
            dg.AssetMaterialization(asset_key=asset_key, metadata={str(k): v for k, v in extra.items()}).metadata
        )
    except Exception as exc:
        raise dg.Failure(
            description=f"the stream function returned metadata Dagster cannot store ({type(exc).__name__}: {exc}); "
            "nothing was committed, the ranges will be retried. Return plain int/float/str/bool or "
            "dagster.MetadataValue values."
        ) from exc


def _ensure_partitions(context: dg.AssetExecutionContext, shards: Sequence[str]) -> None:
    """Shard partitions are added by the member sensors; a run of a shard found since (or a backfill run
    by hand) adds its own, so its materialization is never recorded against an unknown partition."""
    partitions = context.assets_def.partitions_def
    assert isinstance(partitions, dg.DynamicPartitionsDefinition) and partitions.name is not None
    known = set(context.instance.get_dynamic_partitions(partitions.name))
    missing = [s for s in shards if s not in known]
    if missing:
        context.instance.add_dynamic_partitions(partitions.name, missing)


def _watermarks(resource: StreamGroupResource, shards: Sequence[str]) -> dict[str, Watermarks]:
    """The shards' watermarks after a wave (its lag, and where its shards' next ranges end); none when the stream
    does not answer (no lag is reported and the run does not carry on)."""
    try:
        return resource.backend().watermarks(list(shards))
    except StreamError:
        return {}
