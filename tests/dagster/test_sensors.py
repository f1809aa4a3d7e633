"""Member sensors against the real local broker and a SQLite state store, called with build_sensor_context."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.events import DagsterEvent, StepMaterializationData
from dagster._core.test_utils import create_run_for_test

from dagster_streamgroup import protocol
from dagster_streamgroup.dagster import KafkaStreamGroup, StreamSparkResource, tick_context
from dagster_streamgroup.dagster import tags as sgt
from dagster_streamgroup.dagster.checks import LAG_CHECK, PARKED_CHECK
from dagster_streamgroup.launcher import process
from dagster_streamgroup.launcher.worker import RunWorker
from dagster_streamgroup.local.kafka_data import produce_sample
from dagster_streamgroup.stores.ranges import range_index
from tests.dagster.helpers import (
    SensorDriver,
    attempts_of_request,
    counting_asset,
    group_name,
    group_resource,
    ranges_of_request,
    sensors_for,
)
from tests.fixtures.kafka import TopicFactory

pytestmark = pytest.mark.kafka


def test_a_member_requests_one_run_over_all_its_shards_sized_by_backlog(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path
) -> None:
    topic = kafka_topics(partitions=4)
    ends = produce_sample(kafka_bootstrap, topic, 4, 2000)
    assert set(ends.values()) == {501}
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path, max_records_per_run=1000)
    asset = counting_asset(group, [])
    sensors = sensors_for(asset, members=2)
    assert [s.name for s in sensors] == [f"{group}_member_0", f"{group}_member_1"]
    assert sensors[0].minimum_interval_seconds == 1
    with dg.instance_for_test() as instance:
        first, second = (SensorDriver(s, instance, resource) for s in sensors)
        result = first.tick()
        [request] = result.run_requests or []
        assert ranges_of_request(request) == [(f"{topic}:{p}", 0, 250) for p in range(4)], "1,000 split by backlog"
        assert request.partition_key is None and request.asset_selection == [asset.key]
        assert request.run_key is not None and request.run_key.startswith(f"{group}:{first.member_id}:4r:")
        assert request.tags is not None
        # tags hold only what a user filters by; the run key, ranges and attempts are in the run config
        assert request.tags == {sgt.TAG_GROUP: group, sgt.TAG_MEMBER: first.member_id}
        assert attempts_of_request(request) == [0] * 4
        config = next(iter(request.run_config["ops"].values()))["config"]
        assert config["run_key"] == request.run_key
        assert config["member"] == first.member_id and {r["epoch"] for r in config["ranges"]} == {1}
        # one partition per shard, whatever the ranges
        added = result.dynamic_partitions_requests
        assert added and sorted(added[0].partition_keys or []) == [f"{topic}:{p}" for p in range(4)]
        instance.add_dynamic_partitions(sgt.partitions_def_name(group), list(added[0].partition_keys or []))

        # A run whose Dagster run does not exist yet is requested again (a tick may have died before Dagster
        # launched it); no partition is added twice.
        again = first.tick()
        assert [r.run_key for r in again.run_requests or []] == [request.run_key]
        assert not again.dynamic_partitions_requests
        # Once its run exists, it is not requested again (the daemon would only skip it as a duplicate).
        create_run_for_test(
            instance,
            status=dg.DagsterRunStatus.STARTED,
            tags={**request.tags, "dagster/run_key": request.run_key},
        )
        assert not first.tick().run_requests

        # A second member joins: shards with a range in flight stay put until the run ends.
        joined = second.tick()
        assert not joined.run_requests
        assert f"{second.member_id}: owns none" in (joined.skip_reason.skip_message or "" if joined.skip_reason else "")
        state = resource.member("reader").load()
        assert state is not None and set(state.members) == {first.member_id, second.member_id}
        assert all(s.committed == 0 for s in state.shards.values())


def test_shard_mode_requests_one_run_per_range(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path
) -> None:
    topic = kafka_topics(partitions=2)
    produce_sample(kafka_bootstrap, topic, 2, 1000)
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path, run_mode="shard")
    sensor = sensors_for(counting_asset(group, []), members=1)[0]
    with dg.instance_for_test() as instance:
        requests = SensorDriver(sensor, instance, resource).requests()
        assert sorted(ranges_of_request(r)[0] for r in requests) == [(f"{topic}:{p}", 0, 300) for p in range(2)]
        assert sorted(r.run_key or "" for r in requests) == [f"{group}:{topic}:{p}:0-300:a0:e1" for p in range(2)]
        assert all(r.tags and r.tags[sgt.TAG_SHARD] == ranges_of_request(r)[0][0] for r in requests)


def test_idle_member_says_what_it_owns(kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path) -> None:
    topic = kafka_topics(partitions=2)
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path)
    sensor = sensors_for(counting_asset(group, []), members=1)[0]
    with dg.instance_for_test() as instance:
        result = SensorDriver(sensor, instance, resource).tick()
        assert not result.run_requests and result.skip_reason is not None
        assert f"owns {topic}:0, {topic}:1" in (result.skip_reason.skip_message or "")


def test_a_quiet_tick_says_what_it_owns_in_its_skip_reason_only(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path
) -> None:
    """The UI shows a skipped tick's skip reason; a tick log (a captured log stream of its own) is written only
    for a tick that requested runs or has something to say. Ticked as a code server ticks it: the group resource
    found in the code location and the instance from its reference, each built once for all the ticks."""
    topic = kafka_topics(partitions=1)
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path)
    asset = counting_asset(group, [])
    sensor = sensors_for(asset, members=1)[0]
    location = dg.Definitions(
        assets=[asset],
        sensors=[sensor],
        resources={"streamgroup": resource, "pyspark": StreamSparkResource(master="local[1]")},
    )
    tick_context.release()
    with dg.instance_for_test() as instance:

        def tick() -> tuple[dg.SensorResult, bool]:
            with dg.build_sensor_context(
                instance_ref=instance.get_ref(),  # as the daemon calls a sensor: its tick log is captured
                sensor_name=sensor.name,
                repository_name="repo",
                definitions=location,
            ) as context:
                result = sensor(context)
                assert isinstance(result, dg.SensorResult)
                return result, bool(context.has_captured_logs())

        try:
            quiet, logged = tick()
            assert not quiet.run_requests and quiet.skip_reason is not None and not logged
            assert f"owns {topic}:0" in (quiet.skip_reason.skip_message or "")
            produce_sample(kafka_bootstrap, topic, 1, 10)
            busy, logged = tick()
            assert busy.run_requests and logged
            [(_, built, _)] = tick_context._resources.values()
            assert isinstance(built, KafkaStreamGroup) and built.group == group, "one resource for both ticks"
            assert len(tick_context._instances) == 1, "one instance for both ticks"
        finally:
            tick_context.release()  # the instance the ticks opened, closed before the test's instance goes


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
    topic = kafka_topics(partitions=2)
    produce_sample(kafka_bootstrap, topic, 2, 100)
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path, max_attempts=2)
    sensor = sensors_for(counting_asset(group, []), members=1)[0]
    shards = [f"{topic}:0", f"{topic}:1"]
    with dg.instance_for_test() as instance:
        driver = SensorDriver(sensor, instance, resource)
        first = driver.request()
        assert ranges_of_request(first) == [(shards[0], 0, 51), (shards[1], 0, 51)]
        assert first.tags is not None
        # The run crashed: Dagster marks it failed, the run itself never reported.
        create_run_for_test(
            instance, status=dg.DagsterRunStatus.FAILURE, tags={**first.tags, "dagster/run_key": first.run_key or ""}
        )
        # each range is retried with the same offsets, as a new attempt, in a run of its own
        retries = driver.requests()
        assert sorted(ranges_of_request(r)[0] for r in retries) == sorted(ranges_of_request(first))
        assert all(len(ranges_of_request(r)) == 1 and attempts_of_request(r) == [1] for r in retries)
        assert first.run_key not in {r.run_key for r in retries}

        poisoned = next(r for r in retries if ranges_of_request(r)[0][0] == shards[0])
        healthy = next(r for r in retries if ranges_of_request(r)[0][0] == shards[1])
        assert poisoned.tags is not None and healthy.tags is not None
        create_run_for_test(
            instance,
            status=dg.DagsterRunStatus.CANCELED,
            tags={**poisoned.tags, "dagster/run_key": poisoned.run_key or ""},
        )
        create_run_for_test(
            instance,
            status=dg.DagsterRunStatus.STARTED,
            tags={**healthy.tags, "dagster/run_key": healthy.run_key or ""},
        )
        parked = driver.tick()
        assert not parked.run_requests
        checks = [e for e in parked.asset_events if isinstance(e, dg.AssetCheckEvaluation)]
        assert [(c.check_name, c.passed) for c in checks] == [(PARKED_CHECK, False)]
        observed = [e for e in parked.asset_events if isinstance(e, dg.AssetObservation) and "event" in e.metadata]
        assert [(o.partition, o.metadata["event"].value) for o in observed] == [(shards[0], "parked")]
        assert parked.skip_reason is not None
        assert f"PARKED: {shards[0]} [0, 51)" in (parked.skip_reason.skip_message or "")
        state = resource.member("reader").load()
        assert state is not None
        parked_shard = state.shards[shards[0]]
        assert parked_shard.parked is not None and (parked_shard.parked.start, parked_shard.parked.end) == (0, 51)
        assert parked_shard.committed == 0  # nothing skipped
        assert state.shards[shards[1]].parked is None and state.shards[shards[1]].inflight is not None

        quiet = driver.tick()  # the check is reported once, when what is parked changes
        assert not [e for e in quiet.asset_events if isinstance(e, dg.AssetCheckEvaluation)]


def test_lag_of_every_owned_shard_is_observed_and_checked(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path
) -> None:
    topic = kafka_topics(partitions=2)
    before_ms = time.time() * 1000
    produce_sample(kafka_bootstrap, topic, 2, 1000)
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path, lag_alert_records=500)
    sensor = sensors_for(counting_asset(group, []), members=1)[0]
    with dg.instance_for_test() as instance:
        driver = SensorDriver(sensor, instance, resource)
        result = driver.tick()
        observations = [e for e in result.asset_events if isinstance(e, dg.AssetObservation)]
        assert len(observations) == 1
        metadata = observations[0].metadata
        assert metadata[f"lag {topic}:0"].value == 501
        assert metadata["lag"].value == 1002
        # seconds behind: from the first record's own timestamp, written after before_ms (this machine's clock)
        ceiling = (time.time() * 1000 - before_ms) / 1000 + 0.01
        for shard in (f"{topic}:0", f"{topic}:1"):
            assert 0.0 < metadata[f"seconds_behind {shard}"].value < ceiling  # type: ignore[operator]
        assert metadata["seconds_behind"].value == max(
            metadata[f"seconds_behind {topic}:{p}"].value  # type: ignore[type-var]
            for p in (0, 1)
        )
        # The member evaluates the checks its runs plan none of: lag with each lag report, parked at its first tick.
        checks = {e.check_name: e for e in result.asset_events if isinstance(e, dg.AssetCheckEvaluation)}
        assert set(checks) == {LAG_CHECK, PARKED_CHECK} and checks[PARKED_CHECK].passed
        lag = checks[LAG_CHECK]
        assert not lag.passed and lag.metadata["max_lag"].value == 501 and lag.metadata["limit"].value == 500
        assert lag.metadata[f"seconds_behind {topic}:0"].value == metadata[f"seconds_behind {topic}:0"].value
        assert all(r.asset_check_keys == [] for r in result.run_requests or []), "runs plan no check"
        throttled = driver.tick()
        assert not [e for e in throttled.asset_events if isinstance(e, dg.AssetObservation | dg.AssetCheckEvaluation)]


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
        assert sorted(s.owner or "" for s in state.shards.values()) == [first.member_id] * 2 + [second.member_id] * 2

        # a stopped sensor of the same name in another repository of the instance is not this peer
        stop_in_dagster(instance, sensors[1].name, repository="another_project")
        first.repository_name = "__repository__"
        result = first.tick()
        state = resource.member("reader").load()
        assert state is not None and set(state.members) == {first.member_id, second.member_id}

        stop_in_dagster(instance, sensors[1].name)
        result = first.tick()  # long before the session timeout (30 s here)
        assert result.skip_reason is not None
        assert f"{second.member_id} is stopped in Dagster and left the group" in (result.skip_reason.skip_message or "")
        state = resource.member("reader").load()
        assert state is not None and set(state.members) == {first.member_id}
        assert all(s.owner == first.member_id for s in state.shards.values())


def test_a_range_committed_by_a_run_that_died_before_its_materialization_is_recorded_by_the_member(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path
) -> None:
    """The run committed its ranges, then its process was killed before Dagster recorded the materializations
    (simulated here: the commit is made through the member as the run makes it, and the run's record says
    FAILURE with no materialization, as a SIGKILL leaves it). The range must not run again (it is committed),
    and its materialization must not be missing: the member records it, once, marked ``repaired``."""
    topic = kafka_topics(partitions=2)
    produce_sample(kafka_bootstrap, topic, 2, 100)
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path)
    asset = counting_asset(group, [])
    sensor = sensors_for(asset, members=1)[0]
    with dg.instance_for_test() as instance:
        driver = SensorDriver(sensor, instance, resource)
        request = driver.request()
        assert request.tags is not None
        instance.add_dynamic_partitions(sgt.partitions_def_name(group), [f"{topic}:0", f"{topic}:1"])
        launches = resource.member(driver.member_id).tick().inflight
        committed, _ = resource.member(driver.member_id).commit_run_state_only(
            [protocol.report_of(x) for x in launches]
        )
        assert committed.accepted  # ... and the run died before mirroring the offsets to Kafka
        shards = [f"{topic}:0", f"{topic}:1"]
        # Kafka holds the starting offsets the first tick mirrored, not the commit
        assert resource.backend().committed(group, shards) == dict.fromkeys(shards, 0)
        # Before the member looks, the shards take further commits (another run, whose record is not in yet):
        # the died run is no longer the last commit on either shard.
        produce_sample(kafka_bootstrap, topic, 2, 100)
        following = resource.member(driver.member_id).tick().new_launches
        assert {x.shard for x in following} == set(shards)
        later, _ = resource.member(driver.member_id).commit_run_state_only([protocol.report_of(x) for x in following])
        assert later.accepted
        create_run_for_test(
            instance,
            status=dg.DagsterRunStatus.FAILURE,
            tags={**request.tags, "dagster/run_key": request.run_key or ""},
        )
        result = driver.tick()
        repaired = [e for e in result.asset_events if isinstance(e, dg.AssetMaterialization)]
        assert sorted((e.partition, e.metadata["start"].value, e.metadata["end"].value) for e in repaired) == [
            (f"{topic}:0", 0, 51),
            (f"{topic}:1", 0, 51),
        ]
        assert all(e.metadata["repaired"].value is True for e in repaired)
        index = range_index(resource.store())
        assert [index.ranges_between(resource.state_key(), s, 0, 51) for s in shards] == [[(0, 51)], [(0, 51)]], (
            "the member records the repaired ranges' bounds, which the run never did: a backfill aligns to them"
        )
        assert resource.backend().committed(group, shards) == dict.fromkeys(shards, 102), "lag tools see the commit"
        assert not result.run_requests, "a committed range is not run again"
        again = driver.tick()
        assert not [e for e in again.asset_events if isinstance(e, dg.AssetMaterialization)], "recorded once"
        state = resource.member(driver.member_id).load()
        assert state is not None and set(state.unrecorded_runs) == {following[0].run_key}, (
            "the repaired run is confirmed; the run whose record Dagster does not hold yet stays"
        )


def test_a_run_marked_ended_while_its_worker_runs_on_is_repaired_only_once_the_worker_is_gone(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path
) -> None:
    """A run marked CANCELED while its process runs on (a forced termination) may still record the range it
    committed: the member leaves it alone while the worker its tag names is running, and repairs it once that
    process is gone. The worker here is a real process that stands for the run's (a ``sleep``)."""
    topic = kafka_topics(partitions=1)
    produce_sample(kafka_bootstrap, topic, 1, 100)
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path)
    sensor = sensors_for(counting_asset(group, []), members=1)[0]
    with dg.instance_for_test() as instance, subprocess.Popen(["sleep", "300"]) as worker_process:
        driver = SensorDriver(sensor, instance, resource)
        request = driver.request()
        assert request.tags is not None
        instance.add_dynamic_partitions(sgt.partitions_def_name(group), [f"{topic}:0"])
        launches = resource.member(driver.member_id).tick().inflight
        committed, _ = resource.member(driver.member_id).commit_run_state_only(
            [protocol.report_of(x) for x in launches]
        )
        assert committed.accepted
        started = process.start_ticks(worker_process.pid)
        assert started is not None
        worker = RunWorker(
            host=process.hostname(), boot_id=process.boot_id(), pid=worker_process.pid, start_ticks=started, via="spawn"
        )
        create_run_for_test(
            instance,
            status=dg.DagsterRunStatus.CANCELED,
            tags={**request.tags, "dagster/run_key": request.run_key or "", **worker.tag()},
        )
        for _ in range(2):
            result = driver.tick()
            assert not [e for e in result.asset_events if isinstance(e, dg.AssetMaterialization)], "not yet"
            state = resource.member(driver.member_id).load()
            assert state is not None and set(state.unrecorded_runs) == {launches[0].run_key}
        worker_process.kill()
        worker_process.wait()
        result = driver.tick()
        repaired = [e for e in result.asset_events if isinstance(e, dg.AssetMaterialization)]
        assert [(e.partition, e.metadata["start"].value, e.metadata["end"].value) for e in repaired] == [
            (f"{topic}:0", 0, 101)
        ]
        assert not result.run_requests, "a committed range is not run again"


def test_a_run_that_carried_on_and_died_has_only_its_unrecorded_waves_recorded_by_the_member(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path
) -> None:
    """A run that carried on recorded its first wave, then committed its second and was killed before Dagster
    recorded it: the member records the second wave's ranges (the shards' partitions already hold the first
    wave's materializations, so a partition alone does not say a range was recorded), and only those."""
    topic = kafka_topics(partitions=2)
    produce_sample(kafka_bootstrap, topic, 2, 600)  # 301 records per partition
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path, max_records_per_run=200, carry_on_s=60.0)
    asset = counting_asset(group, [])
    shards = [f"{topic}:0", f"{topic}:1"]
    with dg.instance_for_test() as instance:
        driver = SensorDriver(sensors_for(asset, members=1)[0], instance, resource)
        request = driver.request()
        assert request.tags is not None
        instance.add_dynamic_partitions(sgt.partitions_def_name(group), shards)
        member = resource.member(driver.member_id)
        first = protocol.inflight_launches(member.load() or pytest.fail("no state"), driver.member_id)
        outcome, _ = member.commit_run_state_only([protocol.report_of(x) for x in first])
        second, _ = member.carry_on(first[0].run_key, shards, resource.backend().watermarks(shards))
        assert outcome.accepted and [(x.start, x.end) for x in second] == [(100, 200), (100, 200)]
        run = create_run_for_test(
            instance,
            job_name=asset.node_def.name,
            status=dg.DagsterRunStatus.FAILURE,
            tags={**request.tags, "dagster/run_key": request.run_key or ""},
        )
        for launch in first:  # what the run recorded before it was killed
            materialization = dg.AssetMaterialization(
                asset_key=asset.key,
                partition=launch.shard,
                metadata={"start": launch.start, "end": launch.end, "run_key": launch.run_key},
            )
            instance.report_dagster_event(
                DagsterEvent(
                    event_type_value=dg.DagsterEventType.ASSET_MATERIALIZATION.value,
                    job_name=run.job_name,
                    event_specific_data=StepMaterializationData(materialization),
                ),
                run_id=run.run_id,
            )
        outcome, _ = member.commit_run_state_only([protocol.report_of(x) for x in second])
        assert outcome.accepted
        result = driver.tick()
        repaired = [e for e in result.asset_events if isinstance(e, dg.AssetMaterialization)]
        assert sorted((e.partition, e.metadata["start"].value, e.metadata["end"].value) for e in repaired) == [
            (shards[0], 100, 200),
            (shards[1], 100, 200),
        ]
        again = driver.tick()
        assert not [e for e in again.asset_events if isinstance(e, dg.AssetMaterialization)], "recorded once"


@pytest.mark.parametrize("launcher_repaired_first", [False, True], ids=["never repaired", "repaired, not confirmed"])
def test_a_member_gone_for_good_has_its_died_runs_recorded_once_by_a_member_of_its_deployment(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path, launcher_repaired_first: bool
) -> None:
    """Members 2 -> 1: the run of m0 committed and died before its materialization, and m0 is never ticked again
    (its sensor deleted). m1, of the same deployment, records the missing materialization, once, and the entry
    goes; if m0 had recorded the repair itself before it went (but not yet confirmed it), m1 finds that repair
    in the event log and records nothing more."""
    topic = kafka_topics(partitions=2)
    produce_sample(kafka_bootstrap, topic, 2, 100)
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path)
    asset = counting_asset(group, [])
    first, second = sensors_for(asset, members=2)
    shards = [f"{topic}:0", f"{topic}:1"]
    with dg.instance_for_test() as instance:
        launcher, stand_in = SensorDriver(first, instance, resource), SensorDriver(second, instance, resource)
        request = launcher.request()
        assert request.tags is not None
        instance.add_dynamic_partitions(sgt.partitions_def_name(group), shards)
        launches = resource.member(launcher.member_id).tick().inflight
        committed, _ = resource.member(launcher.member_id).commit_run_state_only(
            [protocol.report_of(x) for x in launches]
        )
        assert committed.accepted
        create_run_for_test(
            instance,
            status=dg.DagsterRunStatus.FAILURE,
            tags={**request.tags, "dagster/run_key": request.run_key or ""},
        )
        recorded: list[dg.AssetMaterialization] = []
        if launcher_repaired_first:
            recorded = [e for e in launcher.tick().asset_events if isinstance(e, dg.AssetMaterialization)]
            assert len(recorded) == len(launches)
            for event in recorded:  # as the daemon stores a sensor's asset events
                instance.report_runless_asset_event(event)
        assert resource.member(launcher.member_id).leave()

        for _ in range(3):
            result = stand_in.tick()
            repairs = [e for e in result.asset_events if isinstance(e, dg.AssetMaterialization)]
            for event in repairs:
                instance.report_runless_asset_event(event)
            recorded += repairs
        assert sorted((e.partition, e.metadata["start"].value) for e in recorded) == [(s, 0) for s in shards], (
            "each range recorded exactly once"
        )
        by = {e.metadata["repaired_by"].value for e in recorded}
        assert by == {launcher.member_id if launcher_repaired_first else stand_in.member_id}
        assert all(e.metadata["member"].value == launcher.member_id for e in recorded)
        state = resource.member(stand_in.member_id).load()
        assert state is not None and state.unrecorded_runs == {}, "the entry goes once the records are seen"


def test_a_session_timeout_shorter_than_two_daemon_ticks_fails_the_tick(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path
) -> None:
    """Dagster's daemon evaluates sensors every 5 s at the fastest: a 1 s heartbeat with an 8 s session timeout
    would evict members between two real ticks."""
    topic = kafka_topics(partitions=1)
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path, session_timeout_s=8.0)
    sensor = sensors_for(counting_asset(group, []), members=1)[0]
    with dg.instance_for_test() as instance, pytest.raises(Exception, match=r"session_timeout_s: 8 s .* at least 10 s"):
        SensorDriver(sensor, instance, resource).tick()
    assert resource.member("m").load() is None


def test_a_queued_run_whose_ranges_moved_on_is_cancelled_before_it_starts(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path
) -> None:
    """A run that waited to start while its ranges were fenced out (here: a run key no longer in flight)
    would only have its commit refused; it is cancelled, and the run in flight is left alone. (NOT_STARTED
    stands for QUEUED here: a queued run needs a code location's origin that a unit test does not have.)"""
    topic = kafka_topics(partitions=1)
    produce_sample(kafka_bootstrap, topic, 1, 50)
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path)
    sensor = sensors_for(counting_asset(group, []), members=1)[0]
    with dg.instance_for_test() as instance:
        driver = SensorDriver(sensor, instance, resource)
        request = driver.request()
        assert request.tags is not None
        live = create_run_for_test(
            instance,
            status=dg.DagsterRunStatus.NOT_STARTED,
            tags={**request.tags, "dagster/run_key": request.run_key or ""},
        )
        fenced = create_run_for_test(
            instance,
            status=dg.DagsterRunStatus.NOT_STARTED,
            tags={**request.tags, "dagster/run_key": f"{request.run_key}-of-an-earlier-epoch"},
        )
        result = driver.tick()
        assert result.skip_reason is not None and f"cancelled queued run {fenced.run_id}" in (
            result.skip_reason.skip_message or ""
        )
        assert instance.get_run_by_id(fenced.run_id).status == dg.DagsterRunStatus.CANCELED  # type: ignore[union-attr]
        assert instance.get_run_by_id(live.run_id).status == dg.DagsterRunStatus.NOT_STARTED  # type: ignore[union-attr]


def test_a_launch_that_raised_is_relaunched_with_backoff_and_never_counts_as_an_attempt(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path
) -> None:
    """The run launcher fails for three launches in a row (each run left FAILURE and tagged by
    ``MemberRunCoordinator``, as tests/launcher/test_member_coordinator.py shows it does); with ``max_attempts=2``,
    counting them as attempts would dead-letter both shards. Nothing is parked or dead-lettered, each relaunch
    has the same ranges under a new key after a doubling backoff, and the run that finally starts reads all of
    them."""
    topic = kafka_topics(partitions=2)
    produce_sample(kafka_bootstrap, topic, 2, 100)
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path, max_attempts=2, after_max_attempts="dead_letter")
    sensor = sensors_for(counting_asset(group, []), members=1)[0]
    shards = [f"{topic}:0", f"{topic}:1"]
    with dg.instance_for_test() as instance:
        driver = SensorDriver(sensor, instance, resource)
        request = driver.request()
        planned = ranges_of_request(request)
        assert planned == [(shards[0], 0, 51), (shards[1], 0, 51)]
        keys = [request.run_key]
        observed: list[str] = []
        for failure in range(1, 4):
            assert request.tags is not None
            create_run_for_test(
                instance,
                status=dg.DagsterRunStatus.FAILURE,
                tags={**request.tags, "dagster/run_key": request.run_key or "", sgt.TAG_LAUNCH_FAILED: "ApiException"},
            )
            held = driver.tick()
            assert not held.run_requests, "held back for the backoff"
            assert held.skip_reason is not None and "no attempt counted" in (held.skip_reason.skip_message or "")
            observed += [
                str(e.metadata["event"].value) for e in held.asset_events if isinstance(e, dg.AssetObservation)
            ]
            time.sleep(2 ** (failure - 1) + 0.2)  # the backoff doubles from the 1 s heartbeat
            request = driver.request()
            assert ranges_of_request(request) == planned, "the same bounds"
            assert attempts_of_request(request) == [0, 0]
            keys.append(request.run_key)
        assert keys[1:] == [f"{keys[0]}:l{n}" for n in (1, 2, 3)]
        assert observed == ["launch_failing"], "one event, at the third launch in a row"

        state = resource.member(driver.member_id).load()
        assert state is not None and state.dead_letters == ()
        assert all(state.shards[s].parked is None and state.shards[s].attempt == 0 for s in shards)

        # The launcher recovered: this run starts, reads every planned range and commits them.
        assert request.tags is not None
        create_run_for_test(
            instance,
            status=dg.DagsterRunStatus.STARTED,
            tags={**request.tags, "dagster/run_key": request.run_key or ""},
        )
        member = resource.member(driver.member_id)
        inflight = protocol.inflight_launches(member.load() or state, driver.member_id)
        assert member.commit_run([protocol.report_of(x) for x in inflight]).accepted
        done = member.load()
        assert done is not None and {s: done.shards[s].committed for s in shards} == {s: 51 for s in shards}


def test_a_mirror_keep_alive_that_failed_is_tried_again_after_its_interval_not_at_every_tick(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed keep-alive used to be tried, and logged, at every tick until it succeeded. The broker cannot be
    made to refuse this one commit while it answers the tick's other calls, so the backend's ``keep_alive`` is
    replaced by one that raises (the one stand-in here); the tick itself is real."""
    from dagster_streamgroup.dagster import sensors
    from dagster_streamgroup.streams.base import StreamError

    topic = kafka_topics(1)
    produce_sample(kafka_bootstrap, topic, 1, 10)
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path, mirror_keep_alive_s=60.0)
    member = resource.member("m0")
    member.tick()
    state = member.load()
    assert state is not None
    for launch in protocol.inflight_launches(state, "m0"):
        member.commit(protocol.report_of(launch))
    report = member.tick()
    calls: list[dict[str, int]] = []

    def refused(_group: str, offsets: dict[str, int], _identities: object = None) -> None:
        calls.append(dict(offsets))
        raise StreamError("the broker refused the commit")

    monkeypatch.setattr(resource.backend(), "keep_alive", refused)
    cursor = sensors._Cursor(mirror_kept_at=time.time() - 120)
    first = sensors._keep_mirror_alive(resource, report, cursor)
    assert len(calls) == 1 and first and "failed" in first[0]
    assert sensors._keep_mirror_alive(resource, report, cursor) == [], "not tried (nor logged) at the next tick"
    assert len(calls) == 1
    cursor.mirror_kept_at -= 61
    assert sensors._keep_mirror_alive(resource, report, cursor) and len(calls) == 2, "tried again after the interval"
