"""Member sensors: N Dagster sensors, each one member of the consumer group.

One tick: settle the runs that ended without reporting (crashed or cancelled runs), make peers that an
operator stopped leave the group, run the member tick (heartbeat, evict, rebalance, plan), and request each
run in flight (one per member tick over all its ready shards, by default) whose Dagster run does not exist
yet. Requests are deterministic, so a run recorded by a tick that died before Dagster launched it is requested
again under the same run key. A tick does a few short broker and store calls and never touches Spark. With
nothing to launch while its runs are in flight and a backlog behind them, a tick waits (``tick_wait_s``) for
one of those runs to end and plans again, so a draining member launches its next run at once rather than at
the daemon's next pass.

The member id is the sensor name and the deployment (``<sensor>@<deployment>``): a restarted daemon resumes the
same membership instead of waiting out a session timeout, and two deployments of the same code (each with its
own Dagster instance) are distinct members of one group.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import dagster as dg
from dagster._core.scheduler.instigation import InstigatorStatus, InstigatorType

from dagster_streamgroup import protocol
from dagster_streamgroup.dagster import tags as sgt
from dagster_streamgroup.dagster import tick_context
from dagster_streamgroup.dagster.assets import backfill_asset_of
from dagster_streamgroup.dagster.checks import PARKED_CHECK, lag_check_evaluation, parked_check_evaluation
from dagster_streamgroup.dagster.range_index import record_committed_ranges
from dagster_streamgroup.dagster.recorded import materialized_for
from dagster_streamgroup.dagster.resources import (
    DAEMON_LOOP_S,
    TICK_WAIT_MARGIN_S,
    StreamGroupConfigError,
    StreamGroupResource,
)
from dagster_streamgroup.launcher.worker import RunWorker
from dagster_streamgroup.member import GroupMember, TickReport, mirror_identities, update_state
from dagster_streamgroup.patches import migrations, resource_schema, schema_checks, sqlite_engines
from dagster_streamgroup.protocol import EventKind, GroupState, Launch
from dagster_streamgroup.stores.base import StoreUnavailableError
from dagster_streamgroup.streams.base import StreamError, open_transaction_text, seconds_behind_at

log = logging.getLogger(__name__)

ENDED_UNREPORTED = (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)
ENDED = (dg.DagsterRunStatus.SUCCESS, *ENDED_UNREPORTED)
LAG_REPORT_INTERVAL_S = 30.0


@dataclass(frozen=True)
class StreamTarget:
    """What the sensors launch: the stream asset and the names it was built with."""

    asset: dg.AssetsDefinition
    group: str
    resource_key: str

    @property
    def partitions_def(self) -> dg.DynamicPartitionsDefinition:
        partitions = self.asset.partitions_def
        assert isinstance(partitions, dg.DynamicPartitionsDefinition)
        return partitions


def stream_target(asset: dg.AssetsDefinition) -> StreamTarget:
    metadata = asset.metadata_by_key.get(asset.key, {})
    group = metadata.get(sgt.TAG_GROUP)
    key = metadata.get(sgt.PREFIX + "resource_key")
    if not isinstance(group, str) or not isinstance(key, str):
        raise ValueError(f"asset {asset.key.to_user_string()} was not built with stream_asset()")
    return StreamTarget(asset=asset, group=group, resource_key=key)


def member_sensor_names(group: str, members: int) -> list[str]:
    return [f"{sgt.dagster_name(group)}_member_{i}" for i in range(members)]


def member_sensors(
    asset: dg.AssetsDefinition,
    *,
    members: int = 3,
    heartbeat_interval_s: float = 5.0,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
) -> list[dg.SensorDefinition]:
    """``members`` sensors ``<group>_member_<i>`` that consume the stream of ``asset`` (a ``stream_asset``).

    ``heartbeat_interval_s`` must equal the resource's ``heartbeat_interval_s``: it is the sensor interval
    (Dagster wants it when the sensor is defined, before any resource is built)."""
    if members < 1:
        raise ValueError(f"members: must be >= 1, got {members}")
    if heartbeat_interval_s < 1 or heartbeat_interval_s != int(heartbeat_interval_s):
        raise ValueError(
            "heartbeat_interval_s: Dagster ticks sensors on whole seconds (minimum_interval_seconds), at most once "
            f"a second; got {heartbeat_interval_s}"
        )
    target = stream_target(asset)
    names = member_sensor_names(target.group, members)
    migrations.install()  # every tick that opens the instance checks its schema: parse the scripts once
    sqlite_engines.install()  # and, on a SQLite instance, queries it: one engine per database file
    resource_schema.install()  # and builds the group resource: its config schema inferred once
    schema_checks.install()  # and reads the sensors' states: the tables' existence checked once
    return [_member_sensor(target, name, names, heartbeat_interval_s, default_status) for name in names]


def _member_sensor(
    target: StreamTarget,
    name: str,
    peers: Sequence[str],
    interval_s: float,
    default_status: dg.DefaultSensorStatus,
) -> dg.SensorDefinition:
    backfill = backfill_asset_of(target.asset)

    @dg.sensor(
        name=name,
        # The backfill asset with the stream asset: Dagster adds a sensor's target assets to its code location, so
        # the backfill asset comes with the member sensors. A member's runs select the stream asset alone.
        target=[target.asset] if backfill is None else [target.asset, backfill],
        minimum_interval_seconds=max(1, round(interval_s)),
        default_status=default_status,
        description=(
            f"Member {name} of consumer group {target.group!r}: claims shards, launches offset ranges (resource "
            f"{target.resource_key!r}, built once per code server)."
        ),
        tags={sgt.TAG_GROUP: target.group},
    )
    def _sensor(context: dg.SensorEvaluationContext, **_direct: object) -> dg.SensorResult:
        # ``_direct``: resources a test passes when it calls the sensor directly (found in the context too).
        resource: StreamGroupResource = tick_context.group_resource(context, target.resource_key)
        check_tick_interval(resource, interval_s)
        return evaluate_member_tick(context, resource, target, name, peers)

    return _sensor


def check_tick_interval(resource: StreamGroupResource, interval_s: float) -> None:
    """The session timeout counts heartbeats: a sensor that ticks slower than the resource's
    ``heartbeat_interval_s`` says would have its members evict each other (or, faster, hide a dead one). The
    daemon ticks a sensor every 5 s at the fastest, so a shorter interval is really 5 s, and the session
    timeout must leave room for two of those."""
    if resource.heartbeat_interval_s != interval_s:
        raise StreamGroupConfigError(
            f"heartbeat_interval_s: the resource of group {resource.group!r} says {resource.heartbeat_interval_s:g} s "
            f"but its member sensors tick every {interval_s:g} s; pass the same value to member_sensors()"
        )
    cadence = max(interval_s, DAEMON_LOOP_S)
    if resource.session_timeout_s < 2 * cadence:
        raise StreamGroupConfigError(
            f"session_timeout_s: {resource.session_timeout_s:g} s is less than two sensor ticks of group "
            f"{resource.group!r}; Dagster's daemon ticks sensors every {cadence:g} s at the fastest "
            f"(heartbeat_interval_s is {interval_s:g} s), so members would evict each other: use at least "
            f"{2 * cadence:g} s"
        )
    skipped_pass = 2 * cadence + TICK_WAIT_MARGIN_S
    if resource.tick_wait_s > 0 and resource.session_timeout_s < skipped_pass:
        raise StreamGroupConfigError(
            f"session_timeout_s: {resource.session_timeout_s:g} s of group {resource.group!r} leaves no room for "
            f"a tick that overran its pass (a slow broker or store): the daemon then skips a pass, and "
            f"{2 * cadence:g} s pass between heartbeats; use at least {skipped_pass:g} s, or tick_wait_s=0"
        )


def evaluate_member_tick(
    context: dg.SensorEvaluationContext,
    resource: StreamGroupResource,
    target: StreamTarget,
    sensor_name: str,
    peers: Sequence[str] = (),
) -> dg.SensorResult:
    started = time.monotonic()
    instance = tick_context.tick_instance(context)
    deployment = deployment_id(instance)
    member_id = member_identity(sensor_name, deployment)
    member = resource.member(member_id)
    before = member.load()
    cursor = _Cursor.parse(context.cursor)
    notes: list[str] = []
    repairs: list[dg.AssetMaterialization] = []
    confirmed: list[str] = []
    if instance is not None and before is not None:
        peer_ids = {name: member_identity(name, deployment) for name in peers if name != sensor_name}
        notes += _leave_stopped_peers(resource, instance, before, peer_ids, _repository_of(context))
        notes += _settle_ended_runs(member, instance, before, member_id)
        repairs, confirmed, cursor.repaired = _unrecorded_commits(instance, target, before, member_id, cursor.repaired)
        notes += _record_repaired_ranges(resource, repairs)
    ticked = time.monotonic()
    report = member.tick(recorded=confirmed)
    tick_s = time.monotonic() - ticked
    in_flight = list(protocol.runs_of(report.inflight).values())
    if instance is not None:
        notes += _cancel_fenced_queued_runs(instance, member_id, {sgt.dagster_run_key(x) for x in in_flight})
    runs = _not_launched_yet(instance, list(protocol.runs_of(report.to_request).values()), member_id)
    if not runs and _may_wait_in_tick(instance, resource, _sensors_in_location(context, len(peers))):
        waited = _wait_for_a_run_to_end(resource, member, report, started, tick_s)
        if waited is not None:
            notes.append(waited)
            report = member.tick()
            runs = _not_launched_yet(instance, list(protocol.runs_of(report.to_request).values()), member_id)
    op_name = target.asset.node_def.name
    requests = [
        dg.RunRequest(
            run_key=sgt.dagster_run_key(launches),
            run_config={"ops": {op_name: {"config": sgt.run_config(launches).model_dump()}}},
            tags=sgt.run_tags(launches),
            asset_selection=[target.asset.key],
            asset_check_keys=[],  # the checks are this sensor's to evaluate (checks.py)
        )
        for launches in runs
    ]
    new_keys, cursor.partitions = _new_partition_keys(instance, target, report.state.shards, cursor.partitions)
    checked, cursor = _asset_events(target, resource, report, cursor)
    events: list[dg.AssetMaterialization | dg.AssetObservation | dg.AssetCheckEvaluation] = [*checked]
    events += _group_event_observations(target, report, before)
    events += repairs
    notes += list(report.notes)
    notes += _mirror_repaired(resource, report.state, repairs)
    notes += _keep_mirror_alive(resource, report, cursor)
    summary = _summary(report, notes, time.monotonic() - started)
    if requests or notes:
        context.log.info(summary)
    else:
        # Its skip reason, which the UI shows with the tick: Dagster's tick log would cost the tick a captured log
        # stream of its own (about a quarter of a quiet tick's CPU) to say it again.
        log.debug(summary)
    return dg.SensorResult(
        run_requests=requests,
        skip_reason=None if requests else summary,
        dynamic_partitions_requests=[target.partitions_def.build_add_request(new_keys)] if new_keys else None,
        asset_events=events,
        cursor=cursor.dump(),
    )


DEFAULT_POOL_WORKERS = min(32, (os.cpu_count() or 1) + 4)
"""Threads of a ``ThreadPoolExecutor`` built without ``max_workers``: the code server's gRPC pool, and the sensor
daemon's pool when ``sensors.num_workers`` is unset."""

_TICK_WAIT_SLOTS = threading.BoundedSemaphore(max(1, DEFAULT_POOL_WORKERS // 2))
"""Ticks that may wait at once in one code server: a waiting tick holds one of the code server's gRPC threads
(as many as Python's default thread pool has: cpu count + 4, at most 32), so at most half of them wait and the
other calls (the webserver, the daemon, launches) keep theirs."""


def _sensors_in_location(context: dg.SensorEvaluationContext, peers: int) -> int:
    """The sensors that share the daemon's threads with this one: every sensor of the code location (other
    groups' members, the user's own sensors), or this group's members where the location is not known."""
    repository = context.repository_def
    if repository is not None:
        return max(1, len(list(repository.sensor_defs)))
    return max(1, peers)


def _may_wait_in_tick(instance: dg.DagsterInstance | None, resource: StreamGroupResource, sensors: int) -> bool:
    """A tick may wait for a run only where the daemon evaluates sensors in threads, with more threads than the
    code location has sensors: one after another (or queued behind waiting members), a waiting member would hold
    back the ticks, and heartbeats, of the sensors behind it."""
    if instance is None or resource.tick_wait_s <= 0:
        return False
    settings = instance.get_settings("sensors") or {}
    if not settings.get("use_threads"):
        return False
    workers = settings.get("num_workers") or DEFAULT_POOL_WORKERS
    return int(workers) > sensors


def _wait_for_a_run_to_end(
    resource: StreamGroupResource, member: GroupMember, report: TickReport, started: float, tick_s: float
) -> str | None:
    """With nothing to launch while its runs are in flight and a run's worth of records (``min_backlog``) wait
    behind them, the member waits for one of those runs to end, within ``tick_wait_s`` of the tick's start, so
    their shards' next ranges launch now instead of a daemon pass later. Returns what happened when it waited
    and a run ended, else None (the tick goes on as it was)."""
    mine = report.inflight
    if not mine or resource.tick_wait_s - (time.monotonic() - started) - tick_s <= 0:
        return None
    try:
        marks = resource.backend().watermarks(sorted({x.shard for x in mine}))
    except StreamError:
        return None
    # What is left once the watermarks came back, keeping the time of the second member tick (as long as the
    # first): the tick as a whole ends within tick_wait_s, however slow the broker.
    left = resource.tick_wait_s - (time.monotonic() - started) - tick_s
    if left <= 0:
        return None
    highs = {shard: mark.high for shard, mark in marks.items()}
    if protocol.waiting_behind_inflight(report.state, report.member_id, highs) < resource.min_backlog:
        return None
    if not _TICK_WAIT_SLOTS.acquire(blocking=False):
        return None
    try:
        waiting_since = time.monotonic()
        ended = member.wait_for_run_end({x.run_key for x in mine}, left)
    finally:
        _TICK_WAIT_SLOTS.release()
    if not ended:
        return None
    return f"a run in flight ended {time.monotonic() - waiting_since:.2f} s into the tick's wait: planned again"


DEPLOYMENT_ENV = "STREAMGROUP_DEPLOYMENT"


def deployment_id(instance: dg.DagsterInstance | None) -> str | None:
    """Names the Dagster deployment a member sensor runs in: ``$STREAMGROUP_DEPLOYMENT`` when set, else a
    digest of the id Dagster's run storage keeps for the instance (stable across restarts, distinct for every
    instance storage, SQLite or PostgreSQL alike); ``None`` without an instance (a sensor called directly)."""
    named = os.environ.get(DEPLOYMENT_ENV, "").strip()
    if named:
        return named
    if instance is None:
        return None
    storage_id = getattr(instance.run_storage, "get_run_storage_id", None)  # every SQL run storage has it
    raw = str(storage_id()) if callable(storage_id) else str(instance.root_directory)
    return hashlib.sha256(raw.encode()).hexdigest()[:8]


def member_identity(sensor_name: str, deployment: str | None) -> str:
    """The group member a sensor is in one deployment."""
    return sensor_name if deployment is None else f"{sensor_name}@{deployment}"


def _new_partition_keys(
    instance: dg.DagsterInstance | None, target: StreamTarget, shards: Iterable[str], seen: str
) -> tuple[list[str], str]:
    """Shards without their partition yet: one partition per shard, added once, so the keys stay as few as
    the stream's shards however long it runs. ``seen`` is the digest of the shard set whose partitions the
    last tick made sure of: the same set again needs no query (a run adds its shard's partition itself if it
    went missing since)."""
    name = target.partitions_def.name
    assert name is not None
    keys = list(shards)
    digest = hashlib.sha256("\n".join(sorted(keys)).encode()).hexdigest()[:16]
    if instance is None:
        return keys, ""
    if digest == seen:
        return [], digest
    known = set(instance.get_dynamic_partitions(name))
    return [key for key in keys if key not in known], digest


def _repository_of(context: dg.SensorEvaluationContext) -> tuple[str | None, str | None]:
    """(code location, repository) of the ticking sensor, where Dagster tells them."""
    origin = context.code_location_origin
    return (origin.location_name if origin is not None else None), context.repository_name


def _leave_stopped_peers(
    resource: StreamGroupResource,
    instance: dg.DagsterInstance,
    state: GroupState,
    peers: Mapping[str, str],
    repository: tuple[str | None, str | None] = (None, None),
) -> list[str]:
    """Peers that an operator stopped in Dagster leave now, instead of holding shards for a session timeout.

    ``peers`` maps the other member sensors' names to their member ids in this deployment. Only sensors of
    this sensor's own code location and repository count: a stopped sensor of the same name elsewhere in the
    instance (an old location, another project on the same group) is not a peer, and taking it for one would
    evict a live member on every tick. Members of other deployments carry another deployment id, so a
    sensor stopped here never makes them leave."""
    candidates = {name: mid for name, mid in peers.items() if mid in state.members}
    if not candidates:
        return []
    location, repository_name = repository
    states = [
        s
        for s in instance.all_instigator_state(
            instigator_type=InstigatorType.SENSOR, instigator_statuses={InstigatorStatus.STOPPED}
        )
        if (repository_name is None or s.repository_selector.repository_name == repository_name)
        and (location is None or s.repository_selector.location_name == location)
    ]
    stopped = sorted(candidates[s.instigator_name] for s in states if s.instigator_name in candidates)
    notes = []
    for peer in stopped:

        def transition(current: GroupState | None, now: float, peer: str = peer) -> tuple[GroupState | None, bool]:
            if current is None or peer not in current.members:
                return current, False
            return protocol.leave(current, peer, now), True

        left, _ = update_state(resource.store(), resource.state_key(), transition)
        if left:
            notes.append(f"{peer} is stopped in Dagster and left the group")
    return notes


def _not_launched_yet(
    instance: dg.DagsterInstance | None, runs: Sequence[Sequence[Launch]], member_id: str
) -> list[Sequence[Launch]]:
    """The runs in flight whose Dagster run does not exist yet. Every run in flight is requested until its
    Dagster run exists (a tick may have recorded it and died before Dagster launched it); requesting it again
    after that would only make the daemon skip it as a duplicate run key, on every tick while it runs."""
    if instance is None or not runs:
        return list(runs)
    keys = [sgt.dagster_run_key(launches) for launches in runs]
    records = instance.get_run_records(dg.RunsFilter(tags={"dagster/run_key": keys, sgt.TAG_MEMBER: member_id}))
    existing = {record.dagster_run.tags.get("dagster/run_key") for record in records}
    return [launches for launches, key in zip(runs, keys, strict=True) if key not in existing]


NOT_STARTED_YET = (dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED)


def _cancel_fenced_queued_runs(instance: dg.DagsterInstance, member_id: str, in_flight: set[str]) -> list[str]:
    """Runs of this member that have not started and whose ranges are no longer in flight for it (the shards
    moved on while they waited: an eviction, a drain that expired) could only have their commit refused; left
    queued, they would hold a run slot, and a per-shard run limit, against the shards' real runs. Cancelled
    before they read anything."""
    records = instance.get_run_records(
        dg.RunsFilter(tags={sgt.TAG_MEMBER: member_id}, statuses=list(NOT_STARTED_YET)), limit=200
    )
    notes = []
    for record in records:
        run = record.dagster_run
        key = run.tags.get("dagster/run_key")
        if key is None or key in in_flight:
            continue
        instance.report_run_canceled(
            run, message=f"cancelled by {member_id}: its ranges are no longer in flight for this member (fenced out)"
        )
        notes.append(f"cancelled queued run {run.run_id}: its ranges are no longer in flight")
    return notes


def _settle_ended_runs(
    member: GroupMember, instance: dg.DagsterInstance, state: GroupState, member_id: str
) -> list[str]:
    """A run that crashed or was cancelled cannot report its failure: report it, so its ranges are retried (and a
    run that ended holding ranges, whatever its status: they were never committed). A run
    whose launch raised (tagged by the coordinator or the launcher, never started) read nothing: its ranges are
    relaunched after a backoff without counting an attempt."""
    runs = protocol.runs_of(protocol.inflight_launches(state, member_id))
    if not runs:
        return []
    by_key = {sgt.dagster_run_key(launches): launches for launches in runs.values()}
    records = instance.get_run_records(
        dg.RunsFilter(
            # A run that succeeded holds nothing in flight (it ends after a commit that planned no next wave): one
            # that still does ended without reporting too.
            tags={"dagster/run_key": list(by_key), sgt.TAG_MEMBER: member_id},
            statuses=list(ENDED),
        )
    )
    notes = []
    for record in records:
        run = record.dagster_run
        launches = by_key.get(run.tags.get("dagster/run_key", ""))
        if launches is None:
            continue
        if run.tags.get(sgt.TAG_LAUNCH_FAILED) is not None and record.start_time is None:
            reason = f"run {run.run_id}'s launch raised {run.tags[sgt.TAG_LAUNCH_FAILED]} (see its events)"
            relaunches = member.launch_failed([protocol.report_of(x) for x in launches], reason)
            if relaunches:
                notes.append(f"{reason}: its ranges are relaunched (launch {relaunches} in a row), no attempt counted")
            continue
        outcomes = member.fail_run(
            [protocol.report_of(x) for x in launches], f"run {run.run_id} ended {run.status.value} without reporting"
        )
        handled = {shard: o for shard, o in outcomes.items() if o != protocol.FailOutcome.IGNORED}
        if handled:
            what = ", ".join(
                f"{x.shard} [{x.start}, {x.end}) {handled[x.shard].value}" for x in launches if x.shard in handled
            )
            notes.append(f"run {run.run_id} {run.status.value}: {what}")
    return notes


@dataclass
class _Cursor:
    lag_reported_at: float = 0.0
    parked: tuple[str, ...] | None = None
    dead_letters: int = 0
    repaired: tuple[str, ...] = ()
    """Run keys whose missing materializations this member recorded in the tick that wrote this cursor: the
    next tick confirms them in the group state."""
    partitions: str = ""
    """Digest of the shard set whose partitions exist (or were requested with this cursor)."""
    mirror_kept_at: float = 0.0

    @classmethod
    def parse(cls, text: str | None) -> _Cursor:
        if not text:
            return cls()
        try:
            raw = json.loads(text)
            parked = raw.get("parked")
            return cls(
                lag_reported_at=float(raw.get("lag_reported_at", 0.0)),
                parked=tuple(parked) if parked is not None else None,
                dead_letters=int(raw.get("dead_letters", 0)),
                repaired=tuple(str(k) for k in raw.get("repaired", ())),
                partitions=str(raw.get("partitions", "")),
                mirror_kept_at=float(raw.get("mirror_kept_at", 0.0)),
            )
        except (ValueError, TypeError, AttributeError):
            return cls()

    def dump(self) -> str:
        return json.dumps(
            {
                "lag_reported_at": self.lag_reported_at,
                "parked": list(self.parked) if self.parked is not None else None,
                "dead_letters": self.dead_letters,
                "repaired": list(self.repaired),
                "partitions": self.partitions,
                "mirror_kept_at": self.mirror_kept_at,
            }
        )


def _owned_lag(resource: StreamGroupResource, report: TickReport) -> tuple[dict[str, int], dict[str, tuple[int, int]]]:
    """Lag of every owned shard (the tick knows the watermarks of idle shards only, so ask for the rest), and
    the shards an open transaction holds: ``{shard: (last stable offset, written end)}``."""
    lag = report.lag
    held = {
        sid: (mark.high, mark.uncommitted_high)
        for sid, mark in report.watermarks.items()
        if sid in lag and mark.uncommitted_high is not None and mark.uncommitted_high > mark.high
    }
    missing = [sid for sid in report.owned if sid not in lag and report.state.shards[sid].committed is not None]
    if missing:
        for sid, backend_mark in resource.backend().watermarks(missing).items():
            committed = report.state.shards[sid].committed
            assert committed is not None
            lag[sid] = max(0, backend_mark.written_end - committed)
            if backend_mark.uncommitted_high is not None and backend_mark.held_by_open_transaction:
                held[sid] = (backend_mark.high, backend_mark.uncommitted_high)
    return lag, held


def _owned_seconds_behind(resource: StreamGroupResource, state: GroupState, lag: Mapping[str, int]) -> dict[str, float]:
    """Seconds behind of the shards in ``lag``: a record time is asked only of the shards that lag. A backend
    failure here costs the figure, not the tick (the lag in records is reported all the same)."""
    committed = {sid: state.shards[sid].committed for sid in lag}
    lagging = {sid: c for sid, c in committed.items() if c is not None and lag[sid] > 0}
    try:
        times = resource.backend().record_times(lagging) if lagging else {}
    except StreamError as exc:
        log.warning("group %s: the seconds behind are left out of this lag report: %s", resource.group, exc)
        return {}
    now_ms = int(time.time() * 1000)
    return {
        sid: seconds_behind_at(now_ms, c, c + lag[sid], times.get(sid)) for sid, c in committed.items() if c is not None
    }


def _asset_events(
    target: StreamTarget, resource: StreamGroupResource, report: TickReport, cursor: _Cursor
) -> tuple[list[dg.AssetObservation | dg.AssetCheckEvaluation], _Cursor]:
    """Lag observations and the lag check (throttled), and the parked-ranges check at the first tick and whenever
    what is parked changes."""
    events: list[dg.AssetObservation | dg.AssetCheckEvaluation] = []
    now = time.time()
    due = report.owned and now - cursor.lag_reported_at >= LAG_REPORT_INTERVAL_S
    lag, held = _owned_lag(resource, report) if due else ({}, {})
    if lag:
        seconds = _owned_seconds_behind(resource, report.state, lag)
        metadata: dict[str, dg.RawMetadataValue] = {
            "member": dg.MetadataValue.text(report.member_id),
            "lag": dg.MetadataValue.int(sum(lag.values())),
            "owned_shards": dg.MetadataValue.int(len(report.owned)),
        }
        if seconds:
            metadata["seconds_behind"] = dg.MetadataValue.float(round(max(seconds.values()), 3))
        for shard, value in sorted(lag.items()):
            metadata[f"lag {shard}"] = dg.MetadataValue.int(value)
        for shard, behind in sorted(seconds.items()):
            metadata[f"seconds_behind {shard}"] = dg.MetadataValue.float(round(behind, 3))
        for shard, (stable, written) in sorted(held.items()):
            metadata[f"open transaction {shard}"] = dg.MetadataValue.text(open_transaction_text(stable, written))
        events.append(dg.AssetObservation(asset_key=target.asset.key, metadata=metadata))
        events.append(
            lag_check_evaluation(target.asset.key, lag, resource.lag_alert_records, seconds, resource.lag_alert_seconds)
        )
        cursor.lag_reported_at = now
    parked = tuple(sorted(sid for sid, s in report.state.shards.items() if s.parked is not None))
    dead = len(report.state.dead_letters)
    if parked != cursor.parked or dead != cursor.dead_letters:
        events.append(parked_check_evaluation(target.asset.key, report.state))
        cursor.parked = parked
        cursor.dead_letters = dead
    return events, cursor


def _unrecorded_commits(
    instance: dg.DagsterInstance,
    target: StreamTarget,
    state: GroupState,
    member_id: str,
    repaired: tuple[str, ...],
) -> tuple[list[dg.AssetMaterialization], list[str], tuple[str, ...]]:
    """Materializations of ranges that runs committed and then died before Dagster recorded them (a run process
    killed between its commit and its events): the range is committed, so it is never run again, and only its
    record is missing. Checked by the run's launching member, or by a stand-in of its deployment once that
    member is gone for good (``protocol.checks_unrecorded``). A range counts as recorded when the run recorded
    it or a materialization of the asset's partition names the run's key and the range's start (a repair, by
    whichever member made it: the launching member may have recorded one before it was stopped); otherwise it
    is recorded now, marked ``repaired``.

    Returns the repairs, the run keys to confirm recorded in this tick's state write (every range recorded, or
    repaired by an earlier tick whose cursor Dagster kept), and the run keys repaired now: they are confirmed
    only once the repairs are seen stored (the cursor saying so, or the materializations themselves)."""
    checked = {key: u for key, u in state.unrecorded_runs.items() if protocol.checks_unrecorded(state, member_id, u)}
    if not checked:
        return [], [], ()
    by_dagster_key: dict[str, str] = {}
    for key, unrecorded in checked.items():
        by_dagster_key[key] = key
        by_dagster_key[f"{key}:e{unrecorded.epoch}"] = key  # single-range runs of state schema 2
    records = instance.get_run_records(
        dg.RunsFilter(tags={"dagster/run_key": sorted(by_dagster_key)}, statuses=list(ENDED))
    )
    repairs: list[dg.AssetMaterialization] = []
    confirmed: list[str] = []
    repaired_now: list[str] = []
    for record in records:
        run = record.dagster_run
        found = by_dagster_key.get(run.tags.get("dagster/run_key", ""))
        if found is None or found in confirmed or found in repaired_now:
            continue
        key = found
        entry = checked[key]
        if run.tags.get(sgt.TAG_MEMBER) != entry.member_id:
            continue
        if key in repaired:
            confirmed.append(key)
            continue
        if _may_still_record(run):
            continue  # looked at again next tick, once its worker is gone
        recorded = _recorded_ranges(instance, run.run_id)
        missing = [
            r
            for r in entry.ranges
            if (r[0], r[1]) not in recorded
            and not materialized_for(instance, target.asset.key, key, r, since=record.create_timestamp.timestamp())
        ]
        if not missing:
            confirmed.append(key)
            continue
        repaired_now.append(key)
        for shard, start, end in missing:
            repairs.append(
                dg.AssetMaterialization(
                    asset_key=target.asset.key,
                    partition=shard,
                    metadata={
                        "group": dg.MetadataValue.text(state.group),
                        "shard": dg.MetadataValue.text(shard),
                        "start": dg.MetadataValue.int(start),
                        "end": dg.MetadataValue.int(end),
                        "epoch": dg.MetadataValue.int(entry.epoch),
                        "member": dg.MetadataValue.text(entry.member_id),
                        "committed": dg.MetadataValue.int(end),
                        "run_key": dg.MetadataValue.text(key),
                        "repaired": dg.MetadataValue.bool(True),
                        "repaired_by": dg.MetadataValue.text(member_id),
                        "run_id": dg.MetadataValue.text(run.run_id),
                    },
                    description=f"committed by run {run.run_id}, which ended {run.status.value} before recording "
                    "this materialization",
                )
            )
    return repairs, confirmed, tuple(repaired_now)


def _record_repaired_ranges(resource: StreamGroupResource, repairs: Sequence[dg.AssetMaterialization]) -> list[str]:
    """The bounds of repaired ranges in the store's index (``range_index``): their run died before it recorded them.
    A failure is said in the tick's log: a backfill over those ranges would cut them in pieces."""
    ranges = []
    for repair in repairs:
        start, end = repair.metadata.get("start"), repair.metadata.get("end")
        if repair.partition is None or not isinstance(start, dg.IntMetadataValue):
            continue
        if isinstance(end, dg.IntMetadataValue) and start.value is not None and end.value is not None:
            ranges.append((repair.partition, start.value, end.value))
    try:
        record_committed_ranges(resource, ranges)
    except (StoreUnavailableError, StreamError) as exc:
        return [f"recording the bounds of {len(ranges)} repaired range(s) failed: {exc}"]
    return []


def _may_still_record(run: dg.DagsterRun) -> bool:
    """A run marked FAILURE or CANCELED while its process runs on (a forced termination, run monitoring giving
    up on it) may still commit and record its ranges: repaired now, such a range would be recorded twice. Its
    worker, when its tag names one this host can see, says whether it is gone. A SUCCESS run recorded its
    ranges before it ended (and its worker may be running the next run by then)."""
    if run.status == dg.DagsterRunStatus.SUCCESS:
        return False
    worker = RunWorker.from_tags(run.tags)
    return worker is not None and worker.still_running_here()


def _recorded_ranges(instance: dg.DagsterInstance, run_id: str) -> set[tuple[str, int | None]]:
    """(shard, start) of each range the run recorded a materialization of: a run that carried on recorded several
    ranges of one shard, so the shard alone does not say which."""
    recorded: set[tuple[str, int | None]] = set()
    for entry_record in instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION).records:
        materialization = entry_record.event_log_entry.asset_materialization
        if materialization is None or materialization.partition is None:
            continue
        start = materialization.metadata.get("start")
        recorded.add((materialization.partition, start.value if isinstance(start, dg.IntMetadataValue) else None))
    return recorded


def _mirror_repaired(
    resource: StreamGroupResource, state: GroupState, repairs: Sequence[dg.AssetMaterialization]
) -> list[str]:
    """A run that died between its commit and its offset mirror left the stream's own record of the group
    (Kafka's group offsets, the v3io attribute, what lag tools read) behind: mirror the committed offsets now.
    The mirror only moves forward, so a later commit already mirrored is never undone."""
    offsets = {
        r.partition: committed
        for r in repairs
        if r.partition is not None and (committed := state.shards[r.partition].committed) is not None
    }
    if not offsets:
        return []
    try:
        resource.backend().commit(resource.group, offsets, identities=mirror_identities(state, offsets))
    except StreamError as exc:
        return [f"mirroring the offsets of repaired ranges failed (the next commit mirrors later ones): {exc}"]
    return [f"mirrored the offsets of {len(offsets)} repaired range(s)"]


def _keep_mirror_alive(resource: StreamGroupResource, report: TickReport, cursor: _Cursor) -> list[str]:
    """Every ``mirror_keep_alive_s``, the mirrored offsets of this member's shards are committed again, so
    Kafka's offset expiry never takes an idle partition's. A failure is tried again after the same interval, not
    at every tick (each tick would log it, and Kafka keeps an offset for days: ``offsets.retention.minutes``)."""
    now = time.time()
    if not cursor.mirror_kept_at:  # a member's first tick: its runs mirror what they commit
        cursor.mirror_kept_at = now
        return []
    if now - cursor.mirror_kept_at < resource.mirror_keep_alive_s:
        return []
    cursor.mirror_kept_at = now
    offsets = {
        sid: shard.committed
        for sid, shard in report.state.shards.items()
        if sid in report.owned and shard.committed is not None and not shard.removed
    }
    if not offsets:
        return []
    try:
        resource.backend().keep_alive(resource.group, offsets, mirror_identities(report.state, offsets))
    except StreamError as exc:
        return [f"keeping the mirrored offsets alive failed (tried again in {resource.mirror_keep_alive_s:g} s): {exc}"]
    return [f"mirrored offsets of {len(offsets)} shard(s) committed again"]


OBSERVED_EVENTS = frozenset(
    {
        EventKind.DATA_LOSS,
        EventKind.PARKED,
        EventKind.DEAD_LETTER,
        EventKind.OFFSETS_AHEAD,
        EventKind.DRAIN_EXPIRED,
        EventKind.EVICTED,
        EventKind.CARRIED_OVER,
        EventKind.LAUNCH_FAILING,
        EventKind.RECREATED,
        EventKind.MISSING,
        EventKind.REMOVED,
        EventKind.RESET,
        EventKind.RESET_REFUSED,
        EventKind.ADOPTED,
    }
)


def _group_event_observations(
    target: StreamTarget, report: TickReport, before: GroupState | None
) -> list[dg.AssetObservation]:
    """The group's new events as observations of the stream asset (of the shard's partition where there is
    one), so a retention loss or a dead letter is in the asset's event history whether or not the same tick
    requested runs (a tick that requests runs shows no skip message)."""
    seen = set(before.events) if before is not None else set()
    observations = []
    for event in report.state.events:
        if event in seen:
            continue
        if event.kind not in OBSERVED_EVENTS:
            continue
        metadata: dict[str, dg.RawMetadataValue] = {
            "event": dg.MetadataValue.text(event.kind.value),
            "detail": dg.MetadataValue.text(event.detail),
            "reported_by": dg.MetadataValue.text(report.member_id),
        }
        if event.member_id:
            metadata["member"] = dg.MetadataValue.text(event.member_id)
        if event.start is not None and event.end is not None:
            metadata["start"] = dg.MetadataValue.int(event.start)
            metadata["end"] = dg.MetadataValue.int(event.end)
        observations.append(dg.AssetObservation(asset_key=target.asset.key, partition=event.shard, metadata=metadata))
    return observations


def _summary(report: TickReport, notes: list[str], seconds: float) -> str:
    state = report.state
    owned = ", ".join(report.owned) or "none"
    parts = [f"{report.member_id}: owns {owned}"]
    if report.waiting_for_grace:
        parts.append("waiting for the join grace before claiming shards")
    lag = report.lag
    if lag:
        parts.append(f"lag {sum(lag.values())} records ({', '.join(f'{s}={n}' for s, n in sorted(lag.items()))})")
    if report.inflight:
        parts.append("in flight: " + ", ".join(f"{x.shard} [{x.start}, {x.end}) a{x.attempt}" for x in report.inflight))
    parked = [(sid, s.parked) for sid, s in state.shards.items() if s.parked is not None]
    if parked:
        parts.append(
            "PARKED: "
            + "; ".join(f"{sid} [{p.start}, {p.end}): {p.reason}" for sid, p in parked)
            + " (streamgroup unpark --group ... --shard ...)"
        )
    for event in report.new_events:
        parts.append(f"event {event.kind.value}: {event.shard or event.member_id or ''} {event.detail}".strip())
    parts.extend(notes)
    parts.append(f"tick {seconds:.2f} s")
    return "; ".join(parts)


__all__ = ["PARKED_CHECK", "StreamTarget", "evaluate_member_tick", "member_sensor_names", "member_sensors"]
