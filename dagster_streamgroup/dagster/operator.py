"""What the ``streamgroup`` CLI does to a group: find it in a code location, describe it, unpark, backfill.

Groups are found through the project's own ``Definitions`` (the same resources the sensors and runs use),
so the CLI reads exactly the state and stream they do. Backfills go through the Dagster webserver's GraphQL
API, so they are ordinary Dagster backfills of the stream asset's backfill asset: visible in the UI, one per
``streamgroup backfill``.
"""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg

from dagster_streamgroup import protocol
from dagster_streamgroup.dagster import tags as sgt
from dagster_streamgroup.dagster.assets import backfill_asset_of
from dagster_streamgroup.dagster.range_index import record_committed_ranges
from dagster_streamgroup.dagster.resources import StreamGroupResource
from dagster_streamgroup.member import mirror_identities, update_state
from dagster_streamgroup.protocol import GroupState
from dagster_streamgroup.protocol.backfill import BackfillPlan
from dagster_streamgroup.stores.sql import sqlite_file
from dagster_streamgroup.streams.base import StreamError, Watermarks, open_transaction_text


class OperatorError(Exception):
    """A CLI request that cannot be done; the message says why and what to change."""


@dataclass(frozen=True)
class GroupHandle:
    resource: StreamGroupResource
    resource_key: str
    assets: list[dg.AssetsDefinition]
    """The group's stream assets."""

    def stream_asset(self) -> dg.AssetsDefinition:
        if len(self.assets) != 1:
            raise OperatorError(
                f"--group: expected one stream asset of group {self.resource.group!r}, found {len(self.assets)}"
            )
        return self.assets[0]

    def backfill_asset(self) -> dg.AssetsDefinition:
        """The stream asset's backfill asset, which the member sensors bring into the code location."""
        asset = self.stream_asset()
        found = backfill_asset_of(asset)
        if found is None:
            raise OperatorError(
                f"--group: asset {asset.key.to_user_string()} has no backfill asset (was it built with stream_asset?)"
            )
        return found

    @property
    def replaces_by_coordinates(self) -> bool:
        asset = self.stream_asset()
        return bool(asset.metadata_by_key.get(asset.key, {}).get(sgt.ASSET_REPLACES_BY_COORDINATES))


def find_group(defs: dg.Definitions, group: str) -> GroupHandle:
    resources = {
        key: value
        for key, value in (defs.resources or {}).items()
        if isinstance(value, StreamGroupResource) and value.group == group
    }
    if not resources:
        known = sorted(v.group for v in (defs.resources or {}).values() if isinstance(v, StreamGroupResource))
        raise OperatorError(f"--group: no group {group!r} in these definitions (groups: {', '.join(known) or 'none'})")
    key, resource = next(iter(resources.items()))
    assets = [
        a
        for a in (defs.assets or [])
        if isinstance(a, dg.AssetsDefinition) and a.metadata_by_key.get(a.key, {}).get(sgt.TAG_GROUP) == group
    ]
    return GroupHandle(resource=resource.process_config_and_initialize(), resource_key=key, assets=assets)


@dataclass(frozen=True)
class ShardRow:
    shard: str
    owner: str
    epoch: int
    committed: int | None
    high: int | None
    lag: int | None
    inflight: str
    parked: str
    waits: str = ""
    """Why the shard cannot move on by itself, if it cannot (an open transaction, a backfill's lease)."""
    seconds_behind: float | None = None
    """Now minus the time of the first record not yet committed (0 when caught up); None where lag is unknown."""


def shard_rows(
    state: GroupState, marks: Mapping[str, Watermarks], seconds: Mapping[str, float] | None = None
) -> list[ShardRow]:
    """``seconds``: each shard's seconds behind (``streams.base.seconds_behind``), where known."""
    rows = []
    for sid, shard in state.shards.items():
        mark = marks.get(sid)
        high = None if mark is None else mark.high
        end = None if mark is None else mark.written_end
        lag = max(0, end - shard.committed) if end is not None and shard.committed is not None else None
        waits = ""
        if mark is not None and mark.uncommitted_high is not None and mark.held_by_open_transaction:
            waits = open_transaction_text(mark.high, mark.uncommitted_high)
        if end is not None and shard.committed is not None and end < shard.committed:
            lag = None  # no lag to tell: the log ends below the offset
            waits = (
                f"the stream ends at {end}, below the committed offset {shard.committed}: recreated or truncated "
                "(parked after a session timeout)"
            )
        if shard.lease is not None:
            held = "holds it" if shard.lease.granted_at is not None else "waits for its range in flight"
            waits = "; ".join(filter(None, [waits, f"backfill run {shard.lease.holder} {held}"]))
        inflight = ""
        if shard.inflight is not None:
            f = shard.inflight
            inflight = f"[{f.start}, {f.end}) a{f.attempt} by {f.member_id}"
            if f.orphaned_at is not None:
                inflight += " (draining)"
        parked = f"[{shard.parked.start}, {shard.parked.end}): {shard.parked.reason}" if shard.parked else ""
        owner = shard.owner or "-"
        if shard.owner is not None and shard.owner not in state.members:
            owner += " (left)"
        if shard.removed:
            owner += " (topic removed)"
        behind = (seconds or {}).get(sid) if lag is not None else None
        rows.append(ShardRow(sid, owner, shard.epoch, shard.committed, high, lag, inflight, parked, waits, behind))
    return rows


def load_state(resource: StreamGroupResource) -> GroupState | None:
    state, _ = resource.store().load(resource.state_key())
    return state


def missing_store(resource: StreamGroupResource) -> Path | None:
    """The group's SQLite file when it does not exist: opening it would create an empty one, so a reader (status)
    that looked in the wrong place would leave a second, empty state file behind. None for any other store."""
    path = sqlite_file(resource.resolved_store_url())
    return path if path is not None and not path.exists() else None


def unpark(resource: StreamGroupResource, shard: str, *, skip: bool) -> bool:
    """Resume a parked shard (retry its range) or, with ``skip``, dead-letter the range and move on."""

    def transition(current: GroupState | None, now: float) -> tuple[GroupState | None, bool]:
        if current is None or shard not in current.shards:
            raise OperatorError(f"--shard: {shard} is not a shard of group {resource.group!r}")
        if current.shards[shard].parked is None:
            return current, False
        return protocol.unpark(current, shard, now, skip=skip), True

    changed, stats = update_state(resource.store(), resource.state_key(), transition)
    committed = None if stats.state is None or shard not in stats.state.shards else stats.state.shards[shard].committed
    if changed and skip and committed is not None:
        with contextlib.suppress(StreamError):  # best effort: the shard's next commit mirrors it anyway
            offsets = {shard: committed}
            resource.backend().commit(resource.group, offsets, identities=mirror_identities(stats.state, offsets))
    return changed


class DagsterGraphQL:
    """The few GraphQL calls a backfill needs (the UI uses the same mutations)."""

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/") + "/graphql"
        self.timeout_s = timeout_s

    def execute(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        request = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                payload = json.loads(response.read())
        except (urllib.error.URLError, TimeoutError) as exc:
            raise OperatorError(f"--dagster-url: cannot reach the Dagster webserver at {self.url}: {exc}") from None
        if payload.get("errors"):
            raise OperatorError(f"Dagster GraphQL error: {payload['errors'][0].get('message')}")
        data = payload.get("data")
        assert isinstance(data, dict)
        return data

    def location_of(self, asset_key: dg.AssetKey) -> tuple[str, str]:
        data = self.execute(
            """query($k: AssetKeyInput!) { assetNodeOrError(assetKey: $k) { __typename
                 ... on AssetNode { repository { name location { name } } } } }""",
            {"k": {"path": asset_key.path}},
        )
        node = data["assetNodeOrError"]
        if node.get("__typename") != "AssetNode":
            raise OperatorError(
                f"the webserver at {self.url} does not know asset {asset_key.to_user_string()} (a stream asset's "
                "backfill asset comes with its member sensors: are they in the code location's Definitions, and was "
                "the code location reloaded since this version was installed?)"
            )
        return node["repository"]["location"]["name"], node["repository"]["name"]

    def add_partitions(self, location: str, repository: str, partitions_def: str, keys: Sequence[str]) -> None:
        for key in keys:
            data = self.execute(
                """mutation($r: RepositorySelector!, $p: String!, $k: String!) {
                     addDynamicPartition(repositorySelector: $r, partitionsDefName: $p, partitionKey: $k) {
                       __typename ... on PythonError { message } ... on DuplicateDynamicPartitionError { __typename }
                       ... on UnauthorizedError { message } } }""",
                {
                    "r": {"repositoryLocationName": location, "repositoryName": repository},
                    "p": partitions_def,
                    "k": key,
                },
            )
            kind = data["addDynamicPartition"]["__typename"]
            if kind not in {"AddDynamicPartitionSuccess", "DuplicateDynamicPartitionError"}:
                raise OperatorError(f"adding partition {key}: {data['addDynamicPartition'].get('message', kind)}")

    def launch_backfill(
        self, asset_key: dg.AssetKey, keys: Sequence[str], tags: dict[str, str], title: str, description: str
    ) -> str:
        data = self.execute(
            """mutation($p: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $p) {
                 __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message }
                 ... on InvalidSubsetError { message } ... on UnauthorizedError { message } } }""",
            {
                "p": {
                    "partitionNames": list(keys),
                    "assetSelection": [{"path": asset_key.path}],
                    "tags": [{"key": k, "value": v} for k, v in tags.items()],
                    "title": title,
                    "description": description,
                }
            },
        )
        result = data["launchPartitionBackfill"]
        if result["__typename"] != "LaunchBackfillSuccess":
            raise OperatorError(f"the backfill was not launched: {result.get('message', result['__typename'])}")
        return str(result["backfillId"])

    def backfill_progress(self, backfill_id: str) -> BackfillProgress:
        data = self.execute(
            """query($id: String!) { partitionBackfillOrError(backfillId: $id) { __typename
                 ... on PartitionBackfill { status numPartitions runs(limit: 100) { runId status } }
                 ... on PythonError { message } ... on BackfillNotFoundError { message } } }""",
            {"id": backfill_id},
        )
        found = data["partitionBackfillOrError"]
        if found.get("__typename") != "PartitionBackfill":
            raise OperatorError(f"backfill {backfill_id}: {found.get('message', found.get('__typename'))}")
        runs = {r["runId"]: r["status"] for r in found["runs"]}
        return BackfillProgress(status=found["status"], runs=runs, partitions=int(found.get("numPartitions") or 0))


@dataclass(frozen=True)
class BackfillProgress:
    """A Dagster backfill's status (``REQUESTED`` while it runs) and its runs' statuses, by run id."""

    status: str
    runs: dict[str, str]
    partitions: int = 0

    @property
    def runs_succeeded(self) -> bool:
        """A run of each partition succeeded: nothing is left to do, though Dagster's backfill daemon marks the
        backfill completed only at its next pass (every 30 s)."""
        return len(self.runs) >= max(1, self.partitions) and all(s == "SUCCESS" for s in self.runs.values())

    @property
    def done(self) -> bool:
        ended = all(s in ENDED_RUN_STATUSES for s in self.runs.values())
        return (self.status != "REQUESTED" and ended) or self.runs_succeeded

    @property
    def succeeded(self) -> bool:
        return self.status in {"REQUESTED", "COMPLETED_SUCCESS", "COMPLETED"} and self.runs_succeeded


ENDED_RUN_STATUSES = frozenset({"SUCCESS", "FAILURE", "CANCELED"})


def check_backfill_range(
    handle: GroupHandle, shard: str, start: int, end: int, options: tuple[str, str] = ("--from", "--to")
) -> None:
    """A backfill reads records that exist: a range past the high watermark would make its run wait out the
    stall timeout. ``options`` name where the offsets came from, for the message. What is committed and retained
    is the plan's to check (``dagster/backfill.py``: on the bounds it will read, which alignment may widen)."""
    if start < 0 or end <= start:
        raise OperatorError(f"{options[0]}/{options[1]}: need 0 <= from < to, got offsets [{start}, {end})")
    backend = handle.resource.backend()
    shards = backend.shards()
    if shard not in shards:
        raise OperatorError(f"--shard: {shard} is not a shard of the stream (shards: {', '.join(shards[:8])} ...)")
    high = backend.watermarks([shard])[shard].high
    if end > high:
        raise OperatorError(
            f"{options[1]}: the range ends at offset {end}, past the end of {shard} (high watermark {high}); "
            f"end at {high} at most"
        )


def launch_backfill(handle: GroupHandle, plan: BackfillPlan, *, align: bool, chunk: int, dagster_url: str) -> str:
    """Launch one Dagster backfill of the shard's partition of the group's backfill asset, its range in its tags:
    its one run re-processes ``plan`` (planned again when it starts, from the state it leases; no offset moves).

    An ordinary partition backfill, as the UI launches one: a backfill of the backfill asset's shard partitions with
    the tags ``streamgroup/start`` and ``streamgroup/end`` re-processes that range of each shard."""
    backfill = handle.backfill_asset()
    client = DagsterGraphQL(dagster_url)
    location, repository = client.location_of(backfill.key)
    partitions = backfill.partitions_def
    assert isinstance(partitions, dg.DynamicPartitionsDefinition) and partitions.name is not None
    client.add_partitions(location, repository, partitions.name, [plan.shard])
    tags = sgt.backfill_tags(handle.resource.group, plan.shard, plan.start, plan.end, align=align, chunk=chunk)
    title = f"{handle.resource.group}: {plan.shard} [{plan.start}, {plan.end})"
    what = "committed range(s)" if plan.aligned else "piece(s)"
    description = (
        f"Re-processes {len(plan.ranges)} {what} of {plan.shard} ({plan.records} records) in {len(plan.waves)} "
        "wave(s) of one run; nothing is committed (`streamgroup backfill`)."
    )
    return client.launch_backfill(backfill.key, [plan.shard], tags, title, description)


HISTORY_PAGE = 1000
"""Materializations a query of ``index_history`` reads (Dagster serves at most 10,000 event records a query)."""


def index_history(instance: dg.DagsterInstance, handle: GroupHandle, shards: Sequence[str] = ()) -> dict[str, int]:
    """The upgrade step to a version that keeps an index of committed ranges (``stores/ranges.py``): the bounds of
    the ranges the group committed before, from the stream asset's materializations (the group's commits and the
    members' repairs of them; backfills of earlier versions left out), read page by page with Dagster's cursor and
    recorded page by page. Ranges out of the stream's retention are not kept. Returns the ranges recorded, by shard."""
    asset = handle.stream_asset()
    partitions = asset.partitions_def
    assert isinstance(partitions, dg.DynamicPartitionsDefinition) and partitions.name is not None
    wanted = list(shards) or list(instance.get_dynamic_partitions(partitions.name))
    marks = handle.resource.backend().watermarks(wanted)
    counts: dict[str, int] = {}
    for shard in wanted:
        records_filter = dg.AssetRecordsFilter(asset_key=asset.key, asset_partitions=[shard])
        cursor: str | None = None
        counts[shard] = 0
        while True:
            page = instance.fetch_materializations(records_filter, limit=HISTORY_PAGE, cursor=cursor, ascending=True)
            ranges = []
            for record in page.records:
                materialization = record.asset_materialization
                if materialization is None:
                    continue
                meta = {k: v.value for k, v in materialization.metadata.items()}
                start, end = meta.get("start"), meta.get("end")
                if meta.get("backfill") or not isinstance(start, int) or not isinstance(end, int):
                    continue
                if meta.get("committed") == end or meta.get("repaired"):
                    ranges.append((shard, start, end))
            record_committed_ranges(handle.resource, ranges, marks)
            counts[shard] += len(ranges)
            if not page.has_more:
                break
            cursor = page.cursor
    return counts


def resolve_dead_letters(resource: StreamGroupResource, shard: str | None) -> list[protocol.DeadLetter]:
    """An operator dealt with the dead letters of ``shard`` (or all): they leave the state and the check."""

    def transition(current: GroupState | None, _now: float) -> tuple[GroupState | None, list[protocol.DeadLetter]]:
        if current is None:
            return current, []
        if shard is not None and shard not in current.shards:
            raise OperatorError(f"--shard: {shard} is not a shard of group {resource.group!r}")
        return protocol.resolve_dead_letters(current, shard)

    resolved, _ = update_state(resource.store(), resource.state_key(), transition)
    return resolved


def prune_legacy_partitions(instance: dg.DagsterInstance, group: str, *, dry_run: bool) -> int:
    """The upgrade step from one partition per range to one per shard: the old range keys hold no offsets
    (the group state does), only their materializations' history, which stays in the event log."""
    name = sgt.legacy_partitions_def_name(group)
    keys = list(instance.get_dynamic_partitions(name))
    if not dry_run:
        for key in keys:
            instance.delete_dynamic_partition(name, key)
    return len(keys)


@dataclass(frozen=True)
class ResetMove:
    """One shard of a ``streamgroup reset``: where it is, where it goes, and what its log holds."""

    shard: str
    committed: int | None
    target: int
    low: int
    high: int

    @property
    def what(self) -> str:
        if self.committed is None:
            return f"positioned at {self.target}"
        if self.target > self.committed:
            return f"[{self.committed}, {self.target}) skipped"
        if self.target < self.committed:
            return f"[{self.target}, {self.committed}) read again"
        return "unchanged"


def plan_reset(
    resource: StreamGroupResource,
    shards: Sequence[str],
    to: str | None,
    *,
    offsets: Mapping[str, int] | None = None,
    offset: int | None = None,
    timestamp_ms: int | None = None,
) -> list[ResetMove]:
    """Where ``streamgroup reset`` moves each shard (nothing is written): ``to`` is ``earliest``, ``latest``,
    ``timestamp`` (the first record at or after ``timestamp_ms``) or ``offset`` (``offset``), for ``shards`` (all
    the group consumes when empty); ``offsets`` gives a shard its own offset. Every target is checked against the
    shard's log now: an offset retention deleted, or past the end, is refused naming it."""
    state = load_state(resource)
    if state is None:
        raise OperatorError(
            f"--group: group {resource.group!r} has no state yet: nothing to reset (its members start from the "
            "seek policy, or from the group's offsets in the stream)"
        )
    explicit = dict(offsets or {})
    chosen = list(dict.fromkeys([*shards, *explicit]))
    backend = resource.backend()
    if not chosen:
        listed = backend.listing()
        chosen = [s for s in state.shards if s in listed.shards and not state.shards[s].removed]
    unknown = [s for s in chosen if s not in state.shards]
    if unknown:
        raise OperatorError(f"--shard: {', '.join(unknown)} not a shard of group {resource.group!r}")
    if to is None and set(explicit) != set(chosen):
        raise OperatorError(
            "say where to: --to-earliest, --to-latest, --to-datetime, --to-offset, or --shard SHARD=OFFSET"
        )
    marks = backend.watermarks(chosen)
    gone = [s for s in chosen if s not in marks]
    if gone:
        raise OperatorError(f"--shard: the topic of {', '.join(gone)} does not exist")
    moves = []
    for shard in chosen:
        mark = marks[shard]
        if shard in explicit:
            target, option = explicit[shard], f"--shard {shard}={explicit[shard]}"
        elif to == "earliest":
            target, option = mark.low, "--to-earliest"
        elif to == "latest":
            target, option = mark.high, "--to-latest"
        elif to == "timestamp":
            assert timestamp_ms is not None
            target, option = backend.offset_for_time(shard, timestamp_ms), "--to-datetime"
        else:
            assert offset is not None
            target, option = offset, "--to-offset"
        if target < mark.low:
            raise OperatorError(
                f"{option}: offset {target} of {shard} is out of retention (its log starts at {mark.low})"
            )
        if target > mark.high:
            raise OperatorError(f"{option}: offset {target} of {shard} is past its end ({mark.high})")
        moves.append(ResetMove(shard, state.shards[shard].committed, target, mark.low, mark.high))
    return moves


def apply_reset(resource: StreamGroupResource, moves: Sequence[ResetMove]) -> tuple[GroupState, str | None]:
    """Move the shards through the group state (one compare-and-set: an event per shard, the ranges in flight
    fenced), then restore the stream's record of the group's offsets to them. Returns the state written and, if
    the mirror failed, why (the members' ticks restore it then)."""
    targets = {m.shard: m.target for m in moves}
    backend = resource.backend()
    identities = backend.identities(list(targets))

    def transition(current: GroupState | None, now: float) -> tuple[GroupState | None, None]:
        if current is None:
            raise OperatorError(f"--group: group {resource.group!r} has no state")
        return protocol.reset(current, targets, now, identities, who="an operator (streamgroup reset)"), None

    _, stats = update_state(resource.store(), resource.state_key(), transition)
    assert stats.state is not None
    try:
        backend.commit(resource.group, targets, identities=mirror_identities(stats.state, targets), restore=True)
    except StreamError as exc:
        return stats.state, str(exc)
    return stats.state, None


def mirror_warnings(resource: StreamGroupResource, state: GroupState) -> list[str]:
    """What ``streamgroup status`` warns of: offsets in the stream's record of the group that something other than
    the members wrote (a reset made with Kafka's tool, a v3io committed-sequence attribute set by hand), which the
    next member tick refuses and restores."""
    backend = resource.backend()
    try:
        listed = set(backend.listing().shards)
        found = backend.group_offsets(resource.group, [s for s in state.shards if s in listed])
    except StreamError as exc:
        return [f"the group's offsets in the stream could not be read: {exc}"]
    warnings = []
    for shard, mirrored in found.items():
        committed = state.shards[shard].committed
        if mirrored is None or mirrored.ours or mirrored.offset == committed:
            continue
        warnings.append(
            f"{shard}: the stream's record of the group's offset is {mirrored.offset}, set by something other than "
            f"this group's members (kafka-consumer-groups --reset-offsets, or a v3io shard's committed-sequence "
            f"attribute set by hand?); the group goes on from {committed} and "
            "its next tick refuses and restores it. Move the group with `streamgroup reset`."
        )
    return warnings
