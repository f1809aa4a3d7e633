"""The Schema Registry down during a run (a registry of the test's own, stopped with SIGSTOP: it accepts
connections and answers nothing, as a hung server does): with every schema held nothing is asked of it; with a
writer schema missing the run fails after the registry client's timeout, naming the registry, and the range is
retried with its bounds without counting an attempt."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from dagster_streamgroup.dagster import StreamSparkResource
from dagster_streamgroup.dagster.typed import RunDecoding
from dagster_streamgroup.local.schema_registry import LocalRegistry, RegistryNotInstalledError, running_registry
from tests.dagster.helpers import SensorDriver, group_name, sensors_for
from tests.dagster.test_stream_asset import run
from tests.fixtures.kafka import TopicFactory
from tests.fixtures.required import missing
from tests.integration.formats.helpers import CLICK_V1, CLICK_V2, avro_values, produce
from tests.integration.formats.test_typed_records import collecting_asset, typed_resource

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


@pytest.fixture(scope="module")
def spark() -> StreamSparkResource:
    return StreamSparkResource(master="local[1]")


@pytest.fixture
def own_registry() -> Iterator[LocalRegistry]:
    """A registry this test may stop (the session's is shared)."""
    try:
        context = running_registry()
        registry = context.__enter__()
    except RegistryNotInstalledError as exc:
        missing("registry", str(exc))
    try:
        yield registry
    finally:
        registry.resume()
        context.__exit__(None, None, None)


def test_an_outage_costs_nothing_with_every_schema_held_and_retries_the_range_without_an_attempt_otherwise(
    kafka_bootstrap: str, kafka_topics: TopicFactory, own_registry: LocalRegistry, tmp_path: Path, spark: Any
) -> None:
    url = own_registry.url
    topic = kafka_topics(partitions=1)
    v1 = avro_values(url, topic, CLICK_V1, [{"id": i, "page": f"/{i}", "referrer": ""} for i in range(4)])
    produce(kafka_bootstrap, topic, v1[:2])
    resource = typed_resource(kafka_bootstrap, topic, group_name(), tmp_path, url, schema_registry_timeout_s=1.0)
    session = spark.spark_session
    shard = f"{topic}:0"

    # A run's first wave resolves its reader and meets writer schema 1 ...
    decoding = RunDecoding(resource, None, None)
    first = resource.observed_records(session, {shard: (0, 2)}, decoding)
    assert [r["value"]["id"] for r in first.df.orderBy("offset").collect()] == [0, 1]
    first.settle()
    # ... then the registry hangs: the next wave of the same run decodes from the schemas the run holds.
    produce(kafka_bootstrap, topic, v1[2:])
    own_registry.pause()
    later = resource.observed_records(session, {shard: (2, 4)}, decoding)
    assert [r["value"]["id"] for r in later.df.orderBy("offset").collect()] == [2, 3]
    assert later.settle().shards[shard].decoded == 2

    # A record of a writer schema nobody in the run has seen: the registry must be asked, and cannot answer.
    own_registry.resume()
    newer = avro_values(
        url, topic, CLICK_V2, [{"id": 9, "page": "/9", "price": None, "at": 0, "kind": "BUY", "tags": []}]
    )
    produce(kafka_bootstrap, topic, newer)
    own_registry.pause()
    group = group_name()
    member_resource = typed_resource(
        kafka_bootstrap, topic, group, tmp_path, url, schema_registry_timeout_s=1.0, max_attempts=1
    )
    rows: list[dict[str, Any]] = []
    asset = collecting_asset(group, rows, value_schema=json.dumps(CLICK_V2))  # no registry needed to start
    with dg.instance_for_test() as instance:
        driver = SensorDriver(sensors_for(asset, members=1)[0], instance, member_resource)
        request = driver.request()
        failed = run(asset, instance, member_resource, spark, request)
        assert not failed.success
        errors = [str(e.step_failure_data.error) for e in failed.all_events if e.is_step_failure]
        assert any(f"schema registry {url}" in text and "did not answer" in text for text in errors), errors
        state = member_resource.member("reader").load()
        assert state is not None
        inflight = state.shards[shard].inflight
        assert inflight is not None and (inflight.start, inflight.end, inflight.attempt) == (0, 5, 0), (
            "the same bounds, no attempt counted (max_attempts=1 would have parked it)"
        )
        assert state.shards[shard].parked is None and inflight.relaunches == 1

        own_registry.resume()
        state = member_resource.member("reader").load()
        assert state is not None and state.shards[shard].inflight is not None
        retry = _after_backoff(driver)
        assert run(asset, instance, member_resource, spark, retry).success
        assert sorted(r["value"]["id"] for r in rows) == [0, 1, 2, 3, 9]


def _after_backoff(driver: SensorDriver) -> dg.RunRequest:
    """The relaunch of the range, once its launch backoff (a heartbeat) has passed."""
    import time

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        requests = driver.requests()
        if requests:
            return requests[0]
        time.sleep(0.5)
    raise AssertionError("the range was not relaunched within 30 s")
