"""Shared pieces of the Dagster tests: a stream asset over a test topic, its group resource, sensor ticks."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg

from dagster_streamgroup import protocol
from dagster_streamgroup.dagster import (
    KafkaStreamGroup,
    member_sensors,
    range_key,
    ranges_of,
    stream_asset,
    with_range_column,
)
from dagster_streamgroup.dagster.range_index import record_committed_ranges
from dagster_streamgroup.dagster.sensors import deployment_id, member_identity
from dagster_streamgroup.member import update_state
from dagster_streamgroup.protocol import GroupState


def group_name() -> str:
    return f"g_{uuid.uuid4().hex[:10]}"


def group_resource(bootstrap: str, topic: str, group: str, tmp_path: Path, **overrides: Any) -> KafkaStreamGroup:
    settings: dict[str, Any] = {
        "group": group,
        "bootstrap_servers": bootstrap,
        "topics": [topic],
        "store_url": f"sqlite:///{tmp_path / 'state.db'}",
        "heartbeat_interval_s": 1.0,
        "session_timeout_s": 30.0,
        "join_grace_s": 0.0,
        "max_records_per_run": 300,
        "min_backlog": 1,
        "max_attempts": 2,
    }
    settings.update(overrides)
    return KafkaStreamGroup(**settings)


@dataclass
class SensorDriver:
    """Ticks one member sensor the way the daemon does: the cursor of a tick is given to the next."""

    sensor: dg.SensorDefinition
    instance: dg.DagsterInstance
    resource: KafkaStreamGroup
    cursor: str | None = None
    repository_name: str | None = None
    definitions: dg.Definitions | None = None
    """The code location the sensor is in, where a test needs it (the daemon always has it)."""

    def tick(self) -> dg.SensorResult:
        context = dg.build_sensor_context(
            instance=self.instance,
            sensor_name=self.sensor.name,
            repository_name=self.repository_name,
            cursor=self.cursor,
            resources={"streamgroup": self.resource},
            definitions=self.definitions,
        )
        result = self.sensor(context)
        assert isinstance(result, dg.SensorResult), result
        if result.cursor is not None:
            self.cursor = result.cursor
        return result

    def requests(self) -> list[dg.RunRequest]:
        """One tick's run requests."""
        return list(self.tick().run_requests or [])

    @property
    def member_id(self) -> str:
        """The group member this sensor is in this instance's deployment."""
        return member_identity(self.sensor.name, deployment_id(self.instance))

    def request(self) -> dg.RunRequest:
        """The one run request of a tick."""
        requests = self.requests()
        assert len(requests) == 1, [r.run_key for r in requests]
        return requests[0]


def attempts_of_request(request: dg.RunRequest) -> list[int]:
    """The attempt of each range a run request holds, from its run config (runs carry no attempt tag)."""
    config = next(iter(request.run_config["ops"].values()))["config"]
    return [int(r["attempt"]) for r in config["ranges"]]


def ranges_of_request(request: dg.RunRequest) -> list[tuple[str, int, int]]:
    """(shard, start, end) of each range a run request holds, from its run config."""
    config = next(iter(request.run_config["ops"].values()))["config"]
    return [(r["shard"], r["start"], r["end"]) for r in config["ranges"]]


def counting_asset(
    group: str, seen: list[tuple[str, int, int, int]], fail_with: list[Exception] | None = None
) -> dg.AssetsDefinition:
    """A stream asset that records (shard, start, end, rows) of each range it processed, and optionally raises
    the queued errors first."""

    @stream_asset(group=group, name=f"events_{group}")
    def events(context: dg.AssetExecutionContext, df: Any) -> dict[str, Any]:
        if fail_with:
            raise fail_with.pop(0)
        return count_ranges(context, df, seen)

    return events


def count_ranges(context: dg.AssetExecutionContext, df: Any, seen: list[tuple[str, int, int, int]]) -> dict[str, Any]:
    """Appends (shard, start, end, rows) of each range of ``df`` to ``seen`` (rows told apart by ``with_range_column``,
    as a range-keyed sink does: a backfill's wave holds many ranges of a shard); the rows seen as metadata."""
    ranges = ranges_of(context)
    counts = {row[0]: row[1] for row in with_range_column(df, ranges).groupBy("range").count().collect()}
    for r in ranges:
        seen.append((r.shard, r.start, r.end, int(counts.get(range_key(r.shard, r.start, r.end), 0))))
    return {"rows_seen": dg.MetadataValue.int(sum(counts.values()))}


def sensors_for(asset: dg.AssetsDefinition, members: int = 2) -> list[dg.SensorDefinition]:
    return member_sensors(asset, members=members, heartbeat_interval_s=1)


def materialize_request(
    asset: dg.AssetsDefinition, instance: dg.DagsterInstance, request: dg.RunRequest, resources: dict[str, Any]
) -> dg.ExecuteInProcessResult:
    """Run a member's run request in process, as the daemon would launch it (its config, tags and run key)."""
    assert request.tags is not None
    return dg.materialize(
        [asset],
        instance=instance,
        run_config=request.run_config,
        tags={**request.tags, "dagster/run_key": request.run_key or ""},
        resources=resources,
    )


def commit_ranges(
    resource: KafkaStreamGroup, member_id: str, runs: int, *, record: bool = True
) -> list[tuple[str, int, int]]:
    """``runs`` of the member's runs committed as a run commits them, without Spark: planned by its tick, committed in
    one fenced state write, their bounds recorded in the store's index (``record``; not by versions before it), and
    confirmed recorded as the member's next tick confirms them. The ranges, in commit order."""
    member = resource.member(member_id)
    committed: list[tuple[str, int, int]] = []
    for _ in range(runs):
        launches = member.tick().new_launches
        if not launches:
            break
        reports = [protocol.report_of(x) for x in launches]
        outcome, _ = member.commit_run_state_only(reports)
        assert outcome.accepted, outcome
        ranges = [(r.shard, r.start, r.end) for r in reports]
        if record:
            record_committed_ranges(resource, ranges)

        def confirm(current: GroupState | None, _now: float, key: str = reports[0].run_key) -> tuple[GroupState, None]:
            assert current is not None
            return protocol.confirm_recorded(current, member_id, [key]), None  # as its member's next tick does

        update_state(resource.store(), resource.state_key(), confirm)
        committed += ranges
    return committed
