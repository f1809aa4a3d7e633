"""Member sensors against the real local broker and a SQLite state store, called with build_sensor_context."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
from dagster._core.test_utils import create_run_for_test

from dagster_streamgroup.dagster import tags as sgt
from dagster_streamgroup.dagster.checks import PARKED_CHECK
from dagster_streamgroup.local.kafka_data import produce_sample
from tests.dagster.helpers import SensorDriver, counting_asset, group_name, group_resource, sensors_for
from tests.fixtures.kafka import TopicFactory

pytestmark = pytest.mark.kafka


def test_members_claim_all_shards_and_request_bounded_ranges(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path
) -> None:
    topic = kafka_topics(partitions=4)
    ends = produce_sample(kafka_bootstrap, topic, 4, 2000)
    assert set(ends.values()) == {501}
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path)
    sensors = sensors_for(counting_asset(group, []), members=2)
    assert [s.name for s in sensors] == [f"{group}_member_0", f"{group}_member_1"]
    assert sensors[0].minimum_interval_seconds == 1
    with dg.instance_for_test() as instance:
        first, second = (SensorDriver(s, instance, resource) for s in sensors)
        result = first.tick()
        by_shard = {r.tags["streamgroup/shard"]: r for r in result.run_requests or [] if r.tags}
        assert sorted(by_shard) == [f"{topic}:{p}" for p in range(4)]
        for shard, request in by_shard.items():
            assert request.partition_key == f"{shard}:0-300"
            assert request.run_key == f"{group}:{shard}:0-300:a0:e1"
            assert request.tags is not None
            assert request.tags[sgt.TAG_MEMBER] == sensors[0].name
            assert request.tags[sgt.TAG_START] == "0" and request.tags[sgt.TAG_END] == "300"
            assert request.tags[sgt.TAG_EPOCH] == "1" and request.tags[sgt.TAG_ATTEMPT] == "0"
        added = result.dynamic_partitions_requests
        assert added and sorted(added[0].partition_keys or []) == sorted(r.partition_key for r in by_shard.values())
        instance.add_dynamic_partitions(sgt.partitions_def_name(group), list(added[0].partition_keys or []))

        # Ranges whose run does not exist yet are requested again (a tick may have died before Dagster
        # launched them); no partition is added twice.
        again = first.tick()
        assert sorted(r.run_key or "" for r in again.run_requests or []) == sorted(
            r.run_key or "" for r in by_shard.values()
        )
        assert not again.dynamic_partitions_requests
        # Once a range's run exists, it is not requested again (the daemon would only skip it as a duplicate).
        launched = by_shard[f"{topic}:0"]
        assert launched.tags is not None
        create_run_for_test(
            instance,
            status=dg.DagsterRunStatus.STARTED,
            tags={**launched.tags, "dagster/run_key": launched.run_key or ""},
        )
        rest = first.tick()
        assert sorted(r.tags["streamgroup/shard"] for r in rest.run_requests or [] if r.tags) == [
            f"{topic}:{p}" for p in range(1, 4)
        ]

        # A second member joins: shards with a range in flight stay put until the range ends.
        joined = second.tick()
        assert not joined.run_requests
        assert f"{sensors[1].name}: owns none" in (joined.skip_reason.skip_message or "" if joined.skip_reason else "")
        state = resource.member("reader").load()
        assert state is not None and set(state.members) == {sensors[0].name, sensors[1].name}
        assert all(s.committed == 0 for s in state.shards.values())


def test_idle_member_says_what_it_owns(kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path) -> None:
    topic = kafka_topics(partitions=2)
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path)
    sensor = sensors_for(counting_asset(group, []), members=1)[0]
    with dg.instance_for_test() as instance:
        result = SensorDriver(sensor, instance, resource).tick()
        assert not result.run_requests and result.skip_reason is not None
        assert f"owns {topic}:0, {topic}:1" in (result.skip_reason.skip_message or "")


def test_a_sensor_interval_other_than_the_resources_heartbeat_fails_the_tick(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path
) -> None:
    """Sensors tick every 1 s here; a resource that counts 10 s heartbeats would judge liveness on the
    wrong clock, so the tick fails, naming the field, before touching the group."""
    topic = kafka_topics(partitions=1)
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path, heartbeat_interval_s=10.0)
    sensor = sensors_for(counting_asset(group, []), members=1)[0]
    with dg.instance_for_test() as instance, pytest.raises(Exception, match=r"heartbeat_interval_s: .* says 10 s"):
        SensorDriver(sensor, instance, resource).tick()
    assert resource.member("m").load() is None


def test_a_run_that_ended_without_reporting_is_retried_then_parked(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path
) -> None:
    topic = kafka_topics(partitions=1)
    produce_sample(kafka_bootstrap, topic, 1, 100)
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path, max_attempts=2)
    sensor = sensors_for(counting_asset(group, []), members=1)[0]
    shard = f"{topic}:0"
    with dg.instance_for_test() as instance:
        driver = SensorDriver(sensor, instance, resource)
        first = driver.requests()[shard]
        assert first.tags is not None
        # The run crashed: Dagster marks it failed, the run itself never reported.
        create_run_for_test(
            instance, status=dg.DagsterRunStatus.FAILURE, tags={**first.tags, "dagster/run_key": first.run_key or ""}
        )
        retry = driver.requests()[shard]
        assert retry.partition_key == first.partition_key  # the same offsets ...
        assert retry.run_key != first.run_key and retry.tags is not None  # ... as a new attempt
        assert retry.tags[sgt.TAG_ATTEMPT] == "1"

        create_run_for_test(
            instance, status=dg.DagsterRunStatus.CANCELED, tags={**retry.tags, "dagster/run_key": retry.run_key or ""}
        )
        parked = driver.tick()
        assert not parked.run_requests
        checks = [e for e in parked.asset_events if isinstance(e, dg.AssetCheckEvaluation)]
        assert [(c.check_name, c.passed) for c in checks] == [(PARKED_CHECK, False)]
        assert parked.skip_reason is not None
        assert f"PARKED: {shard} [0, 101)" in (parked.skip_reason.skip_message or "")
        state = resource.member("reader").load()
        assert state is not None
        parked_shard = state.shards[shard]
        assert parked_shard.parked is not None and (parked_shard.parked.start, parked_shard.parked.end) == (0, 101)
        assert parked_shard.committed == 0  # nothing skipped

        quiet = driver.tick()  # the check is reported once, when what is parked changes
        assert not [e for e in quiet.asset_events if isinstance(e, dg.AssetCheckEvaluation)]


def test_lag_of_every_owned_shard_is_observed(kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path) -> None:
    topic = kafka_topics(partitions=2)
    produce_sample(kafka_bootstrap, topic, 2, 1000)
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path)
    sensor = sensors_for(counting_asset(group, []), members=1)[0]
    with dg.instance_for_test() as instance:
        driver = SensorDriver(sensor, instance, resource)
        result = driver.tick()
        observations = [e for e in result.asset_events if isinstance(e, dg.AssetObservation)]
        assert len(observations) == 1
        metadata = observations[0].metadata
        assert metadata[f"lag {topic}:0"].value == 501
        assert metadata["lag"].value == 1002
        throttled = driver.tick()
        assert not [e for e in throttled.asset_events if isinstance(e, dg.AssetObservation)]


def stop_in_dagster(instance: dg.DagsterInstance, sensor_name: str, repository: str = "__repository__") -> None:
    """What stopping a sensor in the UI stores: its instigator state, STOPPED."""
    from dagster._core.remote_origin import (
        RegisteredCodeLocationOrigin,
        RemoteInstigatorOrigin,
        RemoteRepositoryOrigin,
    )
    from dagster._core.scheduler.instigation import InstigatorState, InstigatorStatus, InstigatorType

    origin = RemoteInstigatorOrigin(
        RemoteRepositoryOrigin(RegisteredCodeLocationOrigin("test"), repository), sensor_name
    )
    instance.add_instigator_state(InstigatorState(origin, InstigatorType.SENSOR, InstigatorStatus.STOPPED))


def test_a_peer_stopped_in_dagster_leaves_at_the_next_tick(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path
) -> None:
    topic = kafka_topics(partitions=4)
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path)
    sensors = sensors_for(counting_asset(group, []), members=2)
    with dg.instance_for_test() as instance:
        first, second = (SensorDriver(s, instance, resource) for s in sensors)
        first.tick()
        second.tick()
        first.tick()
        state = resource.member("reader").load()
        assert state is not None
        assert sorted(s.owner or "" for s in state.shards.values()) == [sensors[0].name] * 2 + [sensors[1].name] * 2

        # a stopped sensor of the same name in another repository of the instance is not this peer
        stop_in_dagster(instance, sensors[1].name, repository="another_project")
        first.repository_name = "__repository__"
        result = first.tick()
        state = resource.member("reader").load()
        assert state is not None and set(state.members) == {sensors[0].name, sensors[1].name}

        stop_in_dagster(instance, sensors[1].name)
        result = first.tick()  # long before the session timeout (30 s here)
        assert result.skip_reason is not None
        assert f"{sensors[1].name} is stopped in Dagster and left the group" in (result.skip_reason.skip_message or "")
        state = resource.member("reader").load()
        assert state is not None and set(state.members) == {sensors[0].name}
        assert all(s.owner == sensors[0].name for s in state.shards.values())
