"""A member tick that waits for its run in flight to end, against the real local broker and a SQLite store.

The run's commit is made through the member from another thread, as the run process makes it, while the
sensor tick is being evaluated; the instance says whether the daemon evaluates sensors in threads. A waiting
tick takes the member's heartbeat every daemon pass (5 s at the fastest), so the tests that watch one wait
that long."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from dagster._core.remote_origin import RegisteredCodeLocationOrigin, RemoteInstigatorOrigin, RemoteRepositoryOrigin
from dagster._core.scheduler.instigation import InstigatorState, InstigatorStatus, InstigatorType
from dagster._core.test_utils import create_run_for_test

from dagster_streamgroup import protocol
from dagster_streamgroup.dagster.resources import KafkaStreamGroup
from dagster_streamgroup.local.kafka_data import produce_sample
from tests.dagster.helpers import (
    SensorDriver,
    counting_asset,
    group_name,
    group_resource,
    ranges_of_request,
    sensors_for,
)
from tests.fixtures.kafka import TopicFactory

pytestmark = pytest.mark.kafka

THREADED = {"sensors": {"use_threads": True, "num_workers": 2}}
COMMIT_AFTER_S = 1.5
"""Well after a tick that does not wait has returned, well before a waiting tick's ``tick_wait_s`` (3 s)."""


@contextmanager
def commit_later(
    resource: KafkaStreamGroup, member_id: str, request: dg.RunRequest, after_s: float = COMMIT_AFTER_S
) -> Iterator[None]:
    """The run of ``request`` commits its ranges ``after_s`` from now, from another thread."""
    launches = [x for x in protocol.inflight_launches(_state(resource), member_id) if x.run_key == request.run_key]
    assert launches, "the request's ranges are in flight"
    done = threading.Event()
    outcomes: list[protocol.RunCommitOutcome] = []

    def commit() -> None:
        if not done.wait(after_s):
            outcome, _ = resource.member(member_id).commit_run_state_only([protocol.report_of(x) for x in launches])
            outcomes.append(outcome)

    thread = threading.Thread(target=commit)
    thread.start()
    try:
        yield
    finally:
        thread.join()
    assert outcomes and outcomes[0].accepted


def _state(resource: KafkaStreamGroup) -> protocol.GroupState:
    state = resource.member("reader").load()
    assert state is not None
    return state


def started_run(instance: dg.DagsterInstance, driver: SensorDriver) -> dg.RunRequest:
    """The member's first run, requested and started in Dagster (so the tick has nothing left to request)."""
    request = driver.request()
    assert request.tags is not None
    create_run_for_test(
        instance, status=dg.DagsterRunStatus.STARTED, tags={**request.tags, "dagster/run_key": request.run_key or ""}
    )
    return request


def setup(
    bootstrap: str, topics: TopicFactory, tmp_path: Path, records: int, **overrides: Any
) -> tuple[str, KafkaStreamGroup, dg.SensorDefinition]:
    topic = topics(partitions=2)
    produce_sample(bootstrap, topic, 2, records)
    group = group_name()
    resource = group_resource(bootstrap, topic, group, tmp_path, **{"tick_wait_s": 3.0, **overrides})
    return topic, resource, sensors_for(counting_asset(group, []), members=1)[0]


def test_a_tick_with_a_backlog_behind_its_run_launches_the_next_ranges_once_the_run_commits(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path
) -> None:
    topic, resource, sensor = setup(kafka_bootstrap, kafka_topics, tmp_path, 2000, max_records_per_run=300)
    with dg.instance_for_test(overrides=THREADED) as instance:
        driver = SensorDriver(sensor, instance, resource)
        first = started_run(instance, driver)
        assert ranges_of_request(first) == [(f"{topic}:0", 0, 150), (f"{topic}:1", 0, 150)]
        with commit_later(resource, driver.member_id, first):
            result = driver.tick()
        [following] = result.run_requests or []
        assert ranges_of_request(following) == [(f"{topic}:0", 150, 300), (f"{topic}:1", 150, 300)], (
            "the next ranges start where the committed run ended, in the same tick"
        )


@pytest.mark.parametrize(
    "sensors",
    [None, {"use_threads": True, "num_workers": 1}],
    ids=["one-after-another", "no-thread-besides-the-members"],
)
def test_a_tick_does_not_wait_where_the_daemon_evaluates_sensors_one_after_another(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path, sensors: dict[str, Any] | None
) -> None:
    """Without ``use_threads``, or with no more threads than member sensors, a waiting member would hold back
    the sensors behind it."""
    _, resource, sensor = setup(kafka_bootstrap, kafka_topics, tmp_path, 2000, max_records_per_run=300)
    with dg.instance_for_test(overrides={"sensors": sensors} if sensors else None) as instance:
        driver = SensorDriver(sensor, instance, resource)
        first = started_run(instance, driver)
        with commit_later(resource, driver.member_id, first):
            assert not driver.tick().run_requests
        assert driver.tick().run_requests, "the next tick launches as before"


def test_a_tick_waits_for_its_run_whatever_waits_behind_it_and_launches_nothing_below_min_backlog(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path
) -> None:
    """A quiet stream: the tick waits for its run all the same (one evaluation of the sensor per run instead of
    one per daemon pass), and once the run committed it plans again, finds fewer than ``min_backlog`` records
    and launches nothing."""
    topic, resource, sensor = setup(
        kafka_bootstrap, kafka_topics, tmp_path, 2000, min_backlog=1000, max_records_per_run=5000
    )
    with dg.instance_for_test(overrides=THREADED) as instance:
        driver = SensorDriver(sensor, instance, resource)
        first = started_run(instance, driver)
        assert sum(end - start for _, start, end in ranges_of_request(first)) >= 2000, "the whole backlog"
        produce_sample(kafka_bootstrap, topic, 2, 100)
        with commit_later(resource, driver.member_id, first):
            result = driver.tick()
        assert not result.run_requests and result.skip_reason is not None
        message = result.skip_reason.skip_message or ""
        assert "a run in flight ended" in message and "in flight:" not in message, message


def test_a_tick_wait_off_waits_for_nothing(kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path) -> None:
    _, resource, sensor = setup(kafka_bootstrap, kafka_topics, tmp_path, 2000, max_records_per_run=300, tick_wait_s=0)
    with dg.instance_for_test(overrides=THREADED) as instance:
        driver = SensorDriver(sensor, instance, resource)
        first = started_run(instance, driver)
        with commit_later(resource, driver.member_id, first):
            assert not driver.tick().run_requests


def test_a_slow_broker_does_not_stretch_a_waiting_tick_past_its_budget(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every member tick's check of the broker's group takes 1 s (a stand-in for a slow broker: the real one
    cannot be slowed by exactly that much on demand). The wait keeps the time of one more member tick (as
    long as the first) for its last heartbeat, so the tick still ends within ``tick_wait_s`` of its start
    instead of overrunning it."""
    from dagster_streamgroup.streams.kafka import KafkaBackend

    _, resource, sensor = setup(kafka_bootstrap, kafka_topics, tmp_path, 2000, max_records_per_run=300)
    with dg.instance_for_test(overrides=THREADED) as instance:
        driver = SensorDriver(sensor, instance, resource)
        first = started_run(instance, driver)
        check_group = KafkaBackend.check_group

        def slow_check_group(self: KafkaBackend, group: str) -> Any:
            time.sleep(1.0)
            return check_group(self, group)

        monkeypatch.setattr(KafkaBackend, "check_group", slow_check_group)
        with commit_later(resource, driver.member_id, first, after_s=5.0):  # after the tick: it never ends in it
            started = time.monotonic()
            result = driver.tick()
            took = time.monotonic() - started
    message = (result.skip_reason.skip_message or "") if result.skip_reason else ""
    assert "1 heartbeats" in message and not result.run_requests, message
    assert took <= resource.tick_wait_s + 0.5, f"the tick took {took:.1f} s with a {resource.tick_wait_s:g} s budget"


def test_a_tick_counts_every_sensor_of_its_code_location_not_only_its_group(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path
) -> None:
    """Two groups of one member each in one code location, and two sensor threads: a waiting member of one
    group would hold a thread the other group's member needs, so neither waits."""
    _, resource, sensor = setup(kafka_bootstrap, kafka_topics, tmp_path, 2000, max_records_per_run=300)
    other_group = group_name()
    other = sensors_for(counting_asset(other_group, []), members=1)[0]
    location = dg.Definitions(sensors=[sensor, other], resources={"streamgroup": resource})
    with dg.instance_for_test(overrides=THREADED) as instance:
        driver = SensorDriver(sensor, instance, resource, definitions=location)
        first = started_run(instance, driver)
        with commit_later(resource, driver.member_id, first):
            started = time.monotonic()
            assert not driver.tick().run_requests
            assert time.monotonic() - started < COMMIT_AFTER_S, "the tick waited"


def test_a_session_timeout_without_room_for_a_skipped_pass_is_refused_with_tick_waits(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path
) -> None:
    _, resource, sensor = setup(kafka_bootstrap, kafka_topics, tmp_path, 100, session_timeout_s=10.0)
    refused = pytest.raises(Exception, match=r"session_timeout_s: 10 s .* skips a pass.*at least 11\.5 s")
    with dg.instance_for_test(overrides=THREADED) as instance, refused:
        SensorDriver(sensor, instance, resource).tick()
    _, no_wait, sensor = setup(kafka_bootstrap, kafka_topics, tmp_path, 100, session_timeout_s=10.0, tick_wait_s=0)
    with dg.instance_for_test(overrides=THREADED) as instance:
        SensorDriver(sensor, instance, no_wait).tick()


def _member_heartbeat(resource: KafkaStreamGroup, member_id: str) -> float:
    return _state(resource).members[member_id].heartbeat


def test_a_waiting_tick_takes_the_members_heartbeat_every_daemon_pass(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path
) -> None:
    """A run of 6.5 s: the tick waits through it, heartbeating after 5 s (a daemon pass; its peers would
    otherwise count it silent), and launches the next ranges in the same tick when the run commits."""
    topic, resource, sensor = setup(
        kafka_bootstrap, kafka_topics, tmp_path, 2000, max_records_per_run=300, tick_wait_s=20.0
    )
    with dg.instance_for_test(overrides=THREADED) as instance:
        driver = SensorDriver(sensor, instance, resource)
        first = started_run(instance, driver)
        heartbeats: list[float] = []

        def watch() -> None:
            for _ in range(6):
                time.sleep(1.0)
                heartbeats.append(_member_heartbeat(resource, driver.member_id))

        watcher = threading.Thread(target=watch)
        watcher.start()
        with commit_later(resource, driver.member_id, first, after_s=6.5):
            started = time.monotonic()
            result = driver.tick()
            took = time.monotonic() - started
        watcher.join()
    assert 6.4 <= took < 10.0, f"the tick took {took:.1f} s for a run of 6.5 s"
    assert len(set(heartbeats)) == 2, f"one heartbeat after the tick's own, about 5 s in: {heartbeats}"
    assert 4.5 <= heartbeats[-1] - heartbeats[0] <= 6.0, heartbeats
    [following] = result.run_requests or []
    assert ranges_of_request(following) == [(f"{topic}:0", 150, 300), (f"{topic}:1", 150, 300)]


def test_a_waiting_tick_stops_when_its_sensor_is_stopped(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path
) -> None:
    """Stopped in Dagster while its tick waits: the wait ends at its next heartbeat without taking it (it would
    keep a stopped member in the group), instead of waiting out its run."""
    _, resource, sensor = setup(kafka_bootstrap, kafka_topics, tmp_path, 2000, max_records_per_run=300, tick_wait_s=20)
    with dg.instance_for_test(overrides=THREADED) as instance:
        driver = SensorDriver(sensor, instance, resource, repository_name="repo")
        first = started_run(instance, driver)
        before = _member_heartbeat(resource, driver.member_id)
        origin = RemoteInstigatorOrigin(
            RemoteRepositoryOrigin(RegisteredCodeLocationOrigin("test"), "repo"), sensor.name
        )
        instance.add_instigator_state(InstigatorState(origin, InstigatorType.SENSOR, InstigatorStatus.STOPPED))
        with commit_later(resource, driver.member_id, first, after_s=12.0):
            started = time.monotonic()
            result = driver.tick()
            took = time.monotonic() - started
            assert _member_heartbeat(resource, driver.member_id) == pytest.approx(before, abs=1.0), "no heartbeat"
    message = (result.skip_reason.skip_message or "") if result.skip_reason else ""
    assert "its sensor was stopped in Dagster" in message, message
    assert took < 7.0, f"the tick took {took:.1f} s"


def test_a_waiting_tick_stops_when_its_member_ticks_again(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path
) -> None:
    """A daemon restarted while a tick of its waited: the new daemon's tick of the same member supersedes the
    old call, which stops waiting at its next heartbeat instead of heartbeating beside the new one."""
    topic, resource, sensor = setup(
        kafka_bootstrap, kafka_topics, tmp_path, 2000, max_records_per_run=300, tick_wait_s=20
    )
    # The same member through a resource that does not wait, so the newer tick returns at once.
    at_once = group_resource(kafka_bootstrap, topic, resource.group, tmp_path, max_records_per_run=300, tick_wait_s=0)
    with dg.instance_for_test(overrides=THREADED) as instance:
        driver = SensorDriver(sensor, instance, resource)
        first = started_run(instance, driver)
        old: list[dg.SensorResult] = []
        waiting = threading.Thread(target=lambda: old.append(driver.tick()))
        with commit_later(resource, driver.member_id, first, after_s=12.0):
            started = time.monotonic()
            waiting.start()
            time.sleep(1.0)
            newer = SensorDriver(sensor, instance, at_once, cursor=driver.cursor).tick()
            assert not newer.run_requests, "the run in flight exists: nothing to request"
            waiting.join()
            took = time.monotonic() - started
    message = (old[0].skip_reason.skip_message or "") if old and old[0].skip_reason else ""
    assert "a newer tick of this member started" in message, message
    assert took < 7.0, f"the old tick took {took:.1f} s"


def test_a_run_that_ended_without_reporting_ends_the_wait(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path
) -> None:
    """The run's worker died (Dagster marked the run FAILURE; it never reported): the waiting tick settles it at
    its next heartbeat, as the next tick would, and returns instead of waiting out its budget."""
    _, resource, sensor = setup(kafka_bootstrap, kafka_topics, tmp_path, 2000, max_records_per_run=300, tick_wait_s=20)
    with dg.instance_for_test(overrides=THREADED) as instance:
        driver = SensorDriver(sensor, instance, resource)
        first = started_run(instance, driver)
        [record] = instance.get_run_records(dg.RunsFilter(tags={"dagster/run_key": first.run_key or ""}))

        def fail_later() -> None:
            time.sleep(1.0)
            instance.report_run_failed(record.dagster_run, "the worker died")

        failing = threading.Thread(target=fail_later)
        failing.start()
        started = time.monotonic()
        result = driver.tick()
        took = time.monotonic() - started
        failing.join()
    message = (result.skip_reason.skip_message or "") if result.skip_reason else ""
    run_id = record.dagster_run.run_id
    if result.run_requests:  # the retry launched at once (no backoff), each range in a run of its own
        retried = sorted(x for request in result.run_requests for x in ranges_of_request(request))
        assert retried == sorted(ranges_of_request(first))
    else:
        assert f"run {run_id} FAILURE" in message, message
    assert took < 7.0, f"the tick took {took:.1f} s"
