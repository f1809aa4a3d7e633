"""The README's quick start, as written: its code block runs against the local broker and local Spark (only the
broker's address, the topic, the group name and the output folder are swapped for the test's), and its output
keeps every range: two runs over the same shards leave both ranges' records, where output keyed by shard would
keep the last."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow.parquet as pq
import pytest

from dagster_streamgroup.dagster.devserver import ROOT
from dagster_streamgroup.local.kafka_data import produce_sample
from tests.dagster.helpers import SensorDriver, group_name, materialize_request, ranges_of_request
from tests.fixtures.kafka import TopicFactory

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

README = ROOT / "README.md"
PER_ROUND = 40_000
"""Records per round: above the default ``min_backlog`` (20,000), so a tick launches at once."""


def quick_start_block(marker: str) -> str:
    """The code block right after ``<!-- quick-start: MARKER -->`` in the README, as written."""
    after = README.read_text().split(f"<!-- quick-start: {marker} -->\n", 1)
    assert len(after) == 2, f"the README has no quick-start block marked {marker}"
    return after[1].split("\n", 1)[1].split("\n```", 1)[0]


def quick_start_code() -> str:
    return quick_start_block("definitions.py")


def first_request(driver: SensorDriver, timeout_s: float = 30.0) -> dg.RunRequest:
    """The member's first run request: a new member waits out its join grace (0.8 x the 5 s heartbeat) before it
    claims shards, as the daemon's ticks would."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        requests = driver.requests()
        if requests:
            assert len(requests) == 1, [r.run_key for r in requests]
            return requests[0]
        time.sleep(1.0)
    raise TimeoutError(f"no run request within {timeout_s:g} s")


def test_the_readme_quick_start_runs_and_keeps_every_ranges_output(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic, group = kafka_topics(partitions=2), group_name()
    code = quick_start_code()
    output = tmp_path / "output" / "counts"
    for written in ('"127.0.0.1:9092"', 'topics=["clicks"]', 'group="clickstream"', '"output/counts"'):
        assert written in code, f"the README's quick start no longer says {written}"
    code = (
        code.replace('"127.0.0.1:9092"', repr(kafka_bootstrap))
        .replace('topics=["clicks"]', f"topics=[{topic!r}]")
        .replace('group="clickstream"', f"group={group!r}")
        .replace('"output/counts"', repr(str(output)))  # Spark resolves a relative path against its JVM's start
    )
    monkeypatch.chdir(tmp_path)  # the group state's default store is relative to the working directory
    namespace: dict[str, Any] = {}
    exec(compile(code, str(README), "exec"), namespace)
    defs: dg.Definitions = namespace["defs"]
    asset: dg.AssetsDefinition = namespace["page_views_per_minute"]
    resources = dict(defs.resources or {})
    sensor = next(iter(defs.sensors or []))
    assert isinstance(sensor, dg.SensorDefinition)

    with dg.instance_for_test() as instance:
        driver = SensorDriver(sensor, instance, resources["streamgroup"])
        ranges: list[tuple[str, int, int]] = []
        for _ in range(2):
            produce_sample(kafka_bootstrap, topic, 2, PER_ROUND)
            request = first_request(driver)
            ranges += ranges_of_request(request)
            assert materialize_request(asset, instance, request, resources).success
        state = resources["streamgroup"].member(driver.member_id).load()
        assert state is not None

    assert len(ranges) == 4 and len({(shard, start) for shard, start, _ in ranges}) == 4, ranges
    table = pq.read_table(output)
    by_range: dict[str, int] = {}
    for key, count in zip(table.column("range").to_pylist(), table.column("count").to_pylist(), strict=True):
        by_range[str(key)] = by_range.get(str(key), 0) + int(count)
    assert len(by_range) == 4, sorted(by_range)
    assert sum(by_range.values()) == sum(end - start for _, start, end in ranges), (by_range, ranges)
    assert sum(by_range.values()) == sum(state.shards[s].committed or 0 for s in state.shards)
