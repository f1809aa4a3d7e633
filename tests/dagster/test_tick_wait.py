"""A member tick that waits for its run in flight to end, against the real local broker and a SQLite store.

The run's commit is made through the member from another thread, as the run process makes it, while the
sensor tick is being evaluated; the instance says whether the daemon evaluates sensors in threads."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
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


def test_a_tick_does_not_wait_for_less_than_min_backlog_behind_its_run(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path
) -> None:
    """A quiet stream: waiting would only bring a run too small to launch."""
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
        assert "in flight:" in message and "wait" not in message, message


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
    """Every watermark read takes 2 s (a stand-in for a slow broker: the real one cannot be slowed by exactly
    that much on demand). The wait's budget is what is left after the watermarks came back, less a second
    member tick, so the tick still ends within ``tick_wait_s`` of its start instead of overrunning the
    daemon's next pass."""
    from dagster_streamgroup.streams.kafka import KafkaBackend

    _, resource, sensor = setup(kafka_bootstrap, kafka_topics, tmp_path, 2000, max_records_per_run=300)
    with dg.instance_for_test(overrides=THREADED) as instance:
        driver = SensorDriver(sensor, instance, resource)
        first = started_run(instance, driver)
        watermarks = KafkaBackend.watermarks

        def slow_watermarks(self: KafkaBackend, shards: Any) -> Any:
            time.sleep(2.0)
            return watermarks(self, shards)

        monkeypatch.setattr(KafkaBackend, "watermarks", slow_watermarks)
        with commit_later(resource, driver.member_id, first, after_s=5.0):  # after the tick: it never ends in it
            started = time.monotonic()
            result = driver.tick()
            took = time.monotonic() - started
    # Its shards are all in flight, so the member tick reads no watermarks; the wait's own read takes 2 s, and
    # the wait may only use what is left of the budget after it.
    message = (result.skip_reason.skip_message or "") if result.skip_reason else ""
    assert "tick's wait" not in message and not result.run_requests, message
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
