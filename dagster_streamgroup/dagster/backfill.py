"""Backfills: a stream asset's backfill asset, and what its run does.

Re-processing is recorded on an asset of its own, ``<stream asset>_backfill`` (same shard partitions, same function,
same output), not on the stream asset: Dagster takes a partition's latest materialization for what its metadata
plots (the shard's ``lag`` and ``committed`` offset) and the asset's latest materialization for its freshness, so a
backfill recorded there would show the lag after the backfill's end and keep a stopped group looking fresh. The
stream asset's materializations are the group's commits; the backfill asset's are re-processing, and say so.

A backfill run of a shard:
1. takes the shard's lease in the group state (``protocol/lease.py``): it waits while a member's run holds a range of
   the shard, and no member plans the shard until the backfill releases it, so the two never process the shard at
   once; it says it is alive while it holds the lease, and releases it when it ends;
2. plans what it re-processes (``protocol/backfill.py``) from the state it leased (the group's committed offset) and
   the committed ranges recorded over the request (``range_index``): whole committed ranges, never past the group's
   offset, retention checked on what it will read, unless the sink replaces rows by their coordinates;
3. reads each wave (consecutive ranges, at most ``max_records_per_run`` records) in one Spark read, calls the stream
   function once with the wave's ranges (``ranges_of``: the function writes each range's output), and records one
   materialization of its shard partition per wave. Nothing is committed and no offset moves.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, Protocol

import dagster as dg

from dagster_streamgroup import protocol
from dagster_streamgroup.dagster import tags as sgt
from dagster_streamgroup.dagster.liveness import run_beat_interval_s
from dagster_streamgroup.dagster.range_index import committed_ranges
from dagster_streamgroup.dagster.resources import StreamGroupResource
from dagster_streamgroup.member import ContentionError, update_state
from dagster_streamgroup.protocol import GroupState, LeaseOutcome, LeaseStatus
from dagster_streamgroup.protocol.backfill import BackfillPlan, BackfillRefusedError, plan_backfill

log = logging.getLogger(__name__)

BACKFILL_SUFFIX = "_backfill"
LEASE_POLL_S = 1.0
LEASE_LOG_EVERY_S = 30.0


def backfill_key(stream_key: dg.AssetKey) -> dg.AssetKey:
    """The backfill asset of the stream asset ``stream_key``: ``<name>_backfill`` beside it."""
    return dg.AssetKey([*stream_key.path[:-1], stream_key.path[-1] + BACKFILL_SUFFIX])


class ProcessedWave(Protocol):
    """What a wave's Spark work measured (``assets._ProcessedWave``)."""

    @property
    def records(self) -> dict[str, int]: ...
    @property
    def user_metadata(self) -> dict[str, dg.MetadataValue]: ...
    @property
    def session_s(self) -> float: ...
    @property
    def process_s(self) -> float: ...


WaveProcessor = Callable[[list[sgt.RangeSpec], dict[str, tuple[int, int]]], ProcessedWave]
"""Reads ``{shard: (start, end)}`` in one Spark read and calls the stream function with the wave's ranges."""


class LeaseLostError(dg.Failure):
    """The backfill stopped holding its shard (silent for a session timeout): it must not read on."""


class ShardLease:
    """Context manager: the backfill run ``holder``'s lease on ``shard``, waited for (up to ``wait_s``), kept alive
    every ``beat_s`` while the block runs, released at its end (whatever its outcome)."""

    def __init__(
        self,
        resource: StreamGroupResource,
        shard: str,
        holder: str,
        say: Callable[[str], None],
        *,
        wait_s: float,
        beat_s: float,
    ) -> None:
        self._resource = resource
        self._store = resource.store()
        self._key = resource.state_key()
        self._shard = shard
        self._holder = holder
        self._say = say
        self._wait_s = wait_s
        self._beat_s = beat_s
        self._stop = threading.Event()
        self._lost = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="streamgroup-backfill-lease", daemon=True)
        self.state: GroupState | None = None
        self.waited_s = 0.0

    def _request(self) -> LeaseStatus:
        timeout = self._resource.session_timeout_s

        def transition(current: GroupState | None, now: float) -> tuple[GroupState | None, LeaseStatus]:
            if current is None:
                detail = f"group {self._resource.group!r} has no state yet (no member has ticked)"
                return None, LeaseStatus(LeaseOutcome.UNKNOWN_SHARD, detail)
            return protocol.request_lease(current, self._shard, self._holder, now, timeout)

        status, stats = update_state(self._store, self._key, transition)
        self.state = stats.state
        return status

    def __enter__(self) -> ShardLease:
        try:
            self._wait()
        except BaseException:
            self._release()  # a waiting lease would hold the shard back from the group until it expired
            raise
        self._thread.start()
        return self

    def _wait(self) -> None:
        started = time.monotonic()
        said = -LEASE_LOG_EVERY_S
        while True:
            try:
                status = self._request()
            except ContentionError:
                status = LeaseStatus(LeaseOutcome.WAITING, "the group state changed under every attempt")
            if status.outcome is LeaseOutcome.GRANTED:
                break
            if status.outcome is LeaseOutcome.UNKNOWN_SHARD:
                raise dg.Failure(description=f"backfill of {self._shard}: {status.detail}")
            waited = time.monotonic() - started
            if waited >= self._wait_s:
                raise dg.Failure(
                    description=f"backfill of {self._shard}: the shard was not free within {self._wait_s:.0f} s "
                    f"({status.detail}); nothing was read. Launch it again once the group's run of the shard ended."
                )
            if waited - said >= LEASE_LOG_EVERY_S:
                self._say(f"{self._shard}: waiting for the shard ({status.detail}); no member plans it meanwhile")
                said = waited
            time.sleep(LEASE_POLL_S)
        self.waited_s = time.monotonic() - started

    def _beat(self) -> None:
        while not self._stop.wait(self._beat_s):
            try:
                held = self._touch()
            except Exception as exc:  # a store hiccup: the next beat tries again, within the session timeout
                log.warning("the backfill could not say it holds %s: %s", self._shard, exc)
                continue
            if not held:
                self._lost.set()
                return

    def _touch(self) -> bool:
        def transition(current: GroupState | None, now: float) -> tuple[GroupState | None, bool]:
            if current is None:
                return None, False
            return protocol.touch_lease(current, self._shard, self._holder, now)

        held, _ = update_state(self._store, self._key, transition)
        return held

    def check(self) -> None:
        """Raises once the lease was lost: a backfill silent for a session timeout, whose shard the group took back."""
        if self._lost.is_set():
            raise LeaseLostError(
                description=f"backfill of {self._shard}: its lease on the shard was dropped (the run did not say it "
                f"was alive for {self._resource.session_timeout_s:.0f} s); it stops reading"
            )

    def _release(self) -> None:
        def transition(current: GroupState | None, _now: float) -> tuple[GroupState | None, None]:
            if current is None:
                return None, None
            return protocol.release_lease(current, self._shard, self._holder), None

        try:
            update_state(self._store, self._key, transition)
        except Exception as exc:  # the lease then expires after a session timeout
            self._say(f"{self._shard}: releasing the lease failed ({exc}); it expires in a session timeout")

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self._beat_s + 5)
        self._release()


def requested_ranges(context: dg.AssetExecutionContext, config: sgt.StreamRunConfig) -> list[sgt.RangeSpec]:
    """What a backfill run was asked to re-process: the Launchpad's ranges, or its shard partitions with the range
    of its tags."""
    if config.member is not None or config.run_key is not None:
        raise sgt.RangeTagsError("a backfill run commits nothing: its config names no member and no run_key")
    if config.ranges:
        sgt.check_ranges(config.ranges)
        return list(config.ranges)
    keys = context.partition_keys if context.has_partition_key_range or context.has_partition_key else []
    if not keys:
        raise sgt.RangeTagsError(
            "this backfill names no offset ranges: backfill shard partitions with the tags "
            f"{sgt.TAG_START} and {sgt.TAG_END} (`streamgroup backfill` does), or give ranges in the run config"
        )
    return sgt.ranges_from_backfill_tags(keys, context.run.tags)


def plan_of(
    resource: StreamGroupResource,
    state: GroupState | None,
    spec: sgt.RangeSpec,
    *,
    align: bool,
    chunk: int,
    replaces_by_coordinates: bool,
) -> BackfillPlan:
    """The plan of a backfill of ``spec`` from the group's ``state``, the shard's watermarks and its recorded
    committed ranges: what the CLI shows before launching, and what the run does."""
    shard = state.shards.get(spec.shard) if state is not None else None
    mark = resource.backend().watermarks([spec.shard])[spec.shard]
    recorded = committed_ranges(resource, state, spec.shard, spec.start, spec.end) if align else []
    return plan_backfill(
        spec.shard,
        spec.start,
        spec.end,
        committed=None if shard is None else shard.committed,
        low=mark.low,
        high=mark.high,
        recorded=recorded,
        budget=resource.max_records_per_run,
        chunk=chunk,
        align=align,
        ahead=replaces_by_coordinates,
    )


def describe(plan: BackfillPlan) -> str:
    shown = "committed range(s)" if plan.aligned else "piece(s)"
    return (
        f"{plan.shard} [{plan.start}, {plan.end}): {len(plan.ranges)} {shown}, {plan.records} records, "
        f"{len(plan.waves)} wave(s) of at most {max(w.records for w in plan.waves)} records"
    )


def run_backfill(
    context: dg.AssetExecutionContext,
    config: sgt.StreamRunConfig,
    resource: StreamGroupResource,
    *,
    stream_key: dg.AssetKey,
    replaces_by_coordinates: bool,
    process: WaveProcessor,
) -> Iterator[dg.AssetMaterialization]:
    """The backfill asset's run (see the module docstring)."""
    requested = requested_ranges(context, config)
    coordinates = replaces_by_coordinates
    align, chunk = sgt.backfill_options(context.run.tags, align=not coordinates, chunk=resource.max_records_per_run)
    key = backfill_key(stream_key)
    _ensure_partitions(context, [r.shard for r in requested])
    beat_s = run_beat_interval_s(resource.heartbeat_interval_s, resource.session_timeout_s)
    for spec in requested:
        lease = ShardLease(
            resource, spec.shard, context.run.run_id, context.log.info, wait_s=resource.drain_timeout_s, beat_s=beat_s
        )
        with lease:
            try:
                plan = plan_of(
                    resource,
                    lease.state,
                    spec,
                    align=align,
                    chunk=chunk,
                    replaces_by_coordinates=replaces_by_coordinates,
                )
            except BackfillRefusedError as exc:
                raise dg.Failure(description=f"backfill of {spec.shard}: {exc}; nothing was read") from None
            for note in plan.notes():
                context.log.warning(note)
            waited = f" after waiting {lease.waited_s:.1f} s for the shard" if lease.waited_s >= LEASE_POLL_S else ""
            context.log.info(f"{resource.group}: backfill of {describe(plan)}{waited}; nothing is committed")
            for number, wave in enumerate(plan.waves):
                lease.check()
                ranges = [sgt.RangeSpec(shard=spec.shard, start=lo, end=hi) for lo, hi in wave.ranges]
                context.log.info(
                    f"{spec.shard}: wave {number + 1}/{len(plan.waves)} [{wave.start}, {wave.end}), "
                    f"{len(ranges)} range(s)"
                )
                processed = process(ranges, {spec.shard: (wave.start, wave.end)})
                yield _materialization(key, stream_key, resource, plan, number, processed, lease.state, context)


def _materialization(
    key: dg.AssetKey,
    stream_key: dg.AssetKey,
    resource: StreamGroupResource,
    plan: BackfillPlan,
    number: int,
    processed: ProcessedWave,
    state: GroupState | None,
    context: dg.AssetExecutionContext,
) -> dg.AssetMaterialization:
    wave = plan.waves[number]
    first, last = wave.ranges[0], wave.ranges[-1]
    shard = state.shards.get(plan.shard) if state is not None else None
    backfill_id = context.run.tags.get("dagster/backfill")
    metadata: dict[str, Any] = {
        "group": dg.MetadataValue.text(resource.group),
        "shard": dg.MetadataValue.text(plan.shard),
        "start": dg.MetadataValue.int(wave.start),
        "end": dg.MetadataValue.int(wave.end),
        "records": dg.MetadataValue.int(processed.records.get(plan.shard, 0)),
        "ranges": dg.MetadataValue.int(len(wave.ranges)),
        "first_range": dg.MetadataValue.text(f"[{first[0]}, {first[1]})"),
        "last_range": dg.MetadataValue.text(f"[{last[0]}, {last[1]})"),
        "aligned": dg.MetadataValue.bool(plan.aligned),
        "wave": dg.MetadataValue.int(number),
        "waves": dg.MetadataValue.int(len(plan.waves)),
        "requested": dg.MetadataValue.text(f"[{plan.requested[0]}, {plan.requested[1]})"),
        "backfill_of": dg.MetadataValue.text(stream_key.to_user_string()),
        "session_s": dg.MetadataValue.float(round(processed.session_s, 3)),
        "process_s": dg.MetadataValue.float(round(processed.process_s, 3)),
    }
    if shard is not None and shard.committed is not None:
        metadata["group_committed"] = dg.MetadataValue.int(shard.committed)
    if backfill_id:
        metadata["backfill_id"] = dg.MetadataValue.text(backfill_id)
    metadata.update(processed.user_metadata)
    what = "committed range(s)" if plan.aligned else "piece(s)"
    return dg.AssetMaterialization(
        asset_key=key,
        partition=plan.shard,
        metadata=metadata,
        description=f"re-processed [{wave.start}, {wave.end}) of {plan.shard} ({len(wave.ranges)} {what}) for a "
        f"backfill; nothing was committed: the group's progress is {stream_key.to_user_string()}'s",
    )


def _ensure_partitions(context: dg.AssetExecutionContext, shards: list[str]) -> None:
    """A Launchpad run names shards that may not be partitions yet (a shard found since the sensors last ticked)."""
    partitions = context.assets_def.partitions_def
    if not isinstance(partitions, dg.DynamicPartitionsDefinition) or partitions.name is None:
        return
    known = set(context.instance.get_dynamic_partitions(partitions.name))
    missing = [s for s in dict.fromkeys(shards) if s not in known]
    if missing:
        context.instance.add_dynamic_partitions(partitions.name, missing)
