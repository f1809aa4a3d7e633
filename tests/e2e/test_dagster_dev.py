"""The example project under a real ``dagster dev`` with local Spark, on each stream it supports.

Kafka (the real local broker) and v3io (the real local v3io server, group state next to the stream, access
key required and given only as ``V3IO_ACCESS_KEY``): 200,000 clickstream events over 8 shards, 3 member
sensors. Checked over GraphQL: every run succeeds; materializations cover every offset of every shard
exactly once, contiguously; the offsets mirrored into the stream (Kafka's group offsets, the v3io shard
attribute) equal the high watermarks. Then a member sensor is stopped (its shards are re-owned and progress
resumes), a CLI backfill re-processes a range without moving offsets, and the daemon is killed mid-stream
and started again (nothing lost, nothing committed twice).
"""

from __future__ import annotations

import random
import secrets
import subprocess
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import pytest

from dagster_streamgroup.dagster import KafkaStreamGroup, StreamGroupResource, V3ioStreamGroup
from dagster_streamgroup.dagster.tags import range_partition_key
from dagster_streamgroup.local.kafka_data import create_topics
from dagster_streamgroup.local.v3io.testing import V3ioServerInfo, running_v3io_server
from dagster_streamgroup.streams.base import Watermarks
from jobs.clickstream_events import (
    ensure_v3io_stream,
    produce_burst,
    produce_v3io_burst,
    producers,
    v3io_client,
)
from tests.e2e.dagster_dev import ROOT, DagsterDev, wait_for
from tests.fixtures.v3io import unique_v3io_name

pytestmark = [pytest.mark.e2e, pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(3600)]

PARTITIONS = 8
MEMBERS = 3
MESSAGES = 200_000
HEARTBEAT_S = 3.0
SESSION_TIMEOUT_S = 10.0
ASSET = "page_views_per_minute"
DRAIN_TIMEOUT_S = 1500.0
"""Generous: on 2 shared cores a Spark run costs tens of seconds (minutes under load) before it reads."""
V3IO_CONTAINER = "bigdata"


class ExampleStream:
    """One stream the example runs on: its settings for the example, its group resource, and a producer."""

    resource: StreamGroupResource
    env: dict[str, str]
    """The variables jobs/settings.py reads to reach this stream (and the key, for v3io)."""
    secret: str | None = None
    """A credential that must never show in Dagster's logs, storage or metadata."""
    written: int = 0
    """Records produced so far."""
    per_shard: Counter[str] | None = None
    """Records produced so far per shard, where the producer chooses the shard (None: the client does)."""

    def produce(self, count: int, seed: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Nothing to release unless the stream holds a client."""


class KafkaExample(ExampleStream):
    def __init__(self, bootstrap: str, home: Path) -> None:
        self.bootstrap = bootstrap
        self.topic = f"clicks-{uuid.uuid4().hex[:8]}"
        group = f"e2e_{uuid.uuid4().hex[:8]}"
        create_topics(bootstrap, {self.topic: PARTITIONS})
        self.resource = KafkaStreamGroup(
            group=group,
            bootstrap_servers=bootstrap,
            topics=[self.topic],
            store_url=f"sqlite:///{home / 'streamgroup-state.db'}",
            heartbeat_interval_s=HEARTBEAT_S,
            session_timeout_s=SESSION_TIMEOUT_S,
        )
        self.env = {"CLICKSTREAM_STREAM": "kafka", "CLICKSTREAM_BOOTSTRAP": bootstrap, "CLICKSTREAM_TOPIC": self.topic}

    def produce(self, count: int, seed: int) -> None:
        bulk, trailer = producers({"bootstrap.servers": self.bootstrap})
        produce_burst(bulk, trailer, self.topic, PARTITIONS, count, random.Random(seed))
        self.written += count + PARTITIONS  # the burst ends with one single-record batch per partition


class V3ioExample(ExampleStream):
    def __init__(self, server: V3ioServerInfo) -> None:
        self.key = server.access_key.get_secret_value()
        self.path = unique_v3io_name("clicks")
        self.client = v3io_client(server.endpoint, self.key)
        self.shards = ensure_v3io_stream(self.client, V3IO_CONTAINER, self.path, PARTITIONS)
        assert self.shards == PARTITIONS
        group = f"e2e_{uuid.uuid4().hex[:8]}"
        self.resource = V3ioStreamGroup(
            group=group,
            endpoint=server.endpoint,
            container=V3IO_CONTAINER,
            stream_path=self.path,
            access_key=self.key,
            store_url="v3io",
            heartbeat_interval_s=HEARTBEAT_S,
            session_timeout_s=SESSION_TIMEOUT_S,
        )
        self.env = {
            "CLICKSTREAM_STREAM": "v3io",
            "CLICKSTREAM_V3IO_API": server.endpoint,
            "CLICKSTREAM_V3IO_CONTAINER": V3IO_CONTAINER,
            "CLICKSTREAM_V3IO_STREAM_PATH": self.path,
            "CLICKSTREAM_PARTITIONS": str(PARTITIONS),
            "V3IO_ACCESS_KEY": self.key,
        }
        self.secret = self.key
        self.per_shard = Counter()

    def produce(self, count: int, seed: int) -> None:
        written = produce_v3io_burst(self.client, V3IO_CONTAINER, self.path, self.shards, count, random.Random(seed))
        assert self.per_shard is not None
        self.per_shard.update(written)
        self.written += sum(written.values())

    def close(self) -> None:
        self.client.close()


@pytest.fixture
def work_dir() -> Iterator[Path]:
    """Not pytest's tmp_path: a concurrent pytest session prunes old basetemps, this instance among them."""
    with tempfile.TemporaryDirectory(prefix="streamgroup-e2e-") as tmp:
        yield Path(tmp)


@pytest.fixture
def example_stream(request: pytest.FixtureRequest, work_dir: Path) -> Iterator[ExampleStream]:
    if request.param == "kafka":
        yield KafkaExample(request.getfixturevalue("kafka_bootstrap"), work_dir / "home")
        return
    # A server of its own, over this test's directory, that only accepts a key generated for it.
    with running_v3io_server(work_dir / "v3io-data", access_key=secrets.token_hex(16)) as server:
        stream = V3ioExample(server)
        try:
            yield stream
        finally:
            stream.close()


def committed_at_high(resource: StreamGroupResource) -> dict[str, Watermarks] | None:
    """The watermarks once the offsets mirrored into the stream equal every shard's high watermark."""
    backend = resource.backend()
    shards = backend.shards()
    marks = backend.watermarks(shards)
    committed = backend.committed(resource.group, shards)
    return marks if committed == {s: m.high for s, m in marks.items()} else None


def assert_all_produced(stream: ExampleStream, marks: dict[str, Watermarks]) -> None:
    assert sum(m.high - m.low for m in marks.values()) == stream.written
    if stream.per_shard is not None:
        assert {s: m.high - m.low for s, m in marks.items()} == dict(stream.per_shard)


def assert_exactly_once(materializations: list[dict[str, Any]], marks: dict[str, Watermarks]) -> None:
    """Committed materializations tile [low, high) of every shard: no gap, no overlap, no repeat."""
    spans: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for m in materializations:
        if m.get("backfill"):
            continue
        spans[m["shard"]].append((m["start"], m["end"]))
        assert m["committed"] == m["end"]
    assert sorted(spans) == sorted(marks)
    for shard, ranges in spans.items():
        ranges.sort()
        position = marks[shard].low
        for start, end in ranges:
            assert start == position, f"{shard}: range [{start}, {end}) after offset {position}"
            position = end
        assert position == marks[shard].high, f"{shard}: covered up to {position}, high watermark {marks[shard].high}"


IN_PROGRESS = {"QUEUED", "NOT_STARTED", "STARTING", "STARTED", "CANCELING"}


def ended_runs(dev: DagsterDev, timeout_s: float = 180.0) -> list[dict[str, Any]]:
    """Every run, once none is in progress. The offsets reach the high watermarks inside the last run, at
    its commit, a few seconds before that run ends (its events, Spark's stop)."""

    def ended() -> list[dict[str, Any]] | None:
        runs = dev.runs()
        return None if any(r["status"] in IN_PROGRESS for r in runs) else runs

    return wait_for("every run to end", ended, timeout_s, 2.0)


def assert_runs_succeeded(dev: DagsterDev, allowed_failures: Collection[str] = frozenset()) -> list[dict[str, Any]]:
    runs = ended_runs(dev)
    bad = [(r["runId"], r["status"]) for r in runs if r["status"] != "SUCCESS" and r["runId"] not in allowed_failures]
    assert not bad, bad
    return runs


def assert_secret_absent(secret: str | None, places: list[Path], runs: list[dict[str, Any]]) -> None:
    """The key was only ever in the environment: not in run tags, nor in any file Dagster or Spark wrote."""
    if secret is None:
        return
    assert not [r["runId"] for r in runs if secret in repr(r["tags"])], "a run tag holds the access key"
    needle = secret.encode()
    leaked = [
        str(path)
        for place in places
        for path in ([place] if place.is_file() else sorted(place.rglob("*")))
        if path.is_file() and needle in path.read_bytes()
    ]
    assert not leaked, f"the access key is written in {leaked}"


@pytest.mark.parametrize(
    "example_stream",
    [pytest.param("kafka", marks=pytest.mark.kafka), pytest.param("v3io", marks=pytest.mark.v3io)],
    indirect=True,
)
def test_example_under_dagster_dev(example_stream: ExampleStream, work_dir: Path) -> None:
    stream = example_stream
    resource = stream.resource
    group = resource.group
    stream.produce(MESSAGES, seed=1)
    home = work_dir / "home"
    env = {
        **stream.env,
        "CLICKSTREAM_GROUP": group,
        "CLICKSTREAM_MEMBERS": str(MEMBERS),
        "CLICKSTREAM_HEARTBEAT_S": str(HEARTBEAT_S),
        "CLICKSTREAM_SESSION_TIMEOUT_S": str(SESSION_TIMEOUT_S),
        "CLICKSTREAM_MAX_RECORDS_PER_RUN": "100000",
        "CLICKSTREAM_OUTPUT": str(work_dir / "output"),
        "CLICKSTREAM_SPARK_MASTER": "local[1]",
    }
    log = work_dir / "dagster-dev.log"
    dev = DagsterDev(home, env, log)
    started = time.monotonic()
    try:
        dev.start()

        # 1. The backlog drains: exactly once, contiguous, the stream's offsets at the high watermarks.
        marks = wait_for("the backlog to drain", lambda: committed_at_high(resource), DRAIN_TIMEOUT_S, 5.0)
        print(f"backlog of {stream.written} records drained after {time.monotonic() - started:.0f} s", flush=True)
        assert_all_produced(stream, marks)
        runs = assert_runs_succeeded(dev)
        assert {r["tags"].get("streamgroup/member") for r in runs} <= {f"{group}_member_{i}" for i in range(MEMBERS)}
        assert_exactly_once(dev.materializations(ASSET), marks)

        # 2. A member sensor is stopped: it leaves, its shards are re-owned, progress resumes.
        stopped = f"{group}_member_0"
        dev.stop_sensor(stopped)
        stopped_at = time.monotonic()

        def reowned() -> float | None:
            state = resource.member("e2e").load()
            assert state is not None
            if stopped in state.members or any(s.owner == stopped for s in state.shards.values()):
                return None
            return time.monotonic() - stopped_at

        reowned_after = wait_for("the stopped member's shards to be re-owned", reowned, 120.0, 1.0)
        print(f"shards of the stopped member re-owned after {reowned_after:.1f} s", flush=True)
        state = resource.member("e2e").load()
        assert state is not None and set(state.members) == {f"{group}_member_1", f"{group}_member_2"}
        stream.produce(8_000, seed=2)
        marks = wait_for("progress after the stop", lambda: committed_at_high(resource), DRAIN_TIMEOUT_S, 5.0)
        assert_all_produced(stream, marks)

        # 3. A backfill from the CLI: listed as a Dagster backfill, re-processes, moves no offset.
        shard = sorted(marks)[0]
        first = marks[shard].low
        command = [str(ROOT / ".venv/bin/streamgroup"), "backfill", "--group", group, "--shard", shard]
        cli = subprocess.run(
            [*command, "--from", str(first), "--to", str(first + 1000), "--chunk", "500", "--dagster-url", dev.url],
            cwd=ROOT,
            env=dev.env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert cli.returncode == 0, cli.stderr + cli.stdout
        backfill_id = cli.stdout.split()[1].rstrip(":")
        keys = {range_partition_key(shard, first, first + 500), range_partition_key(shard, first + 500, first + 1000)}

        def backfill_done() -> list[dict[str, Any]] | None:
            runs = [r for r in dev.runs() if r["tags"].get("dagster/backfill") == backfill_id]
            done = len(runs) == 2 and all(r["status"] in {"SUCCESS", "FAILURE", "CANCELED"} for r in runs)
            return runs if done else None

        backfill_runs = wait_for("the CLI backfill", backfill_done, DRAIN_TIMEOUT_S, 5.0)
        assert {r["status"] for r in backfill_runs} == {"SUCCESS"}
        assert {r["tags"]["streamgroup/shard"] for r in backfill_runs} == {shard}
        backfilled = [m for m in dev.materializations(ASSET) if m.get("backfill")]
        assert {m["partition"] for m in backfilled} == keys
        assert {m["records"] for m in backfilled} == {500}
        assert committed_at_high(resource) == marks  # offsets did not move

        # 4. The daemon is killed mid-stream and started again.
        stop_producing = threading.Event()

        def keep_producing() -> None:
            seed = 3
            while not stop_producing.is_set():
                stream.produce(2_000, seed=seed)
                seed += 1
                stop_producing.wait(1.0)

        producer = threading.Thread(target=keep_producing, daemon=True)
        producer.start()
        try:
            wait_for("a run in progress", lambda: any(r["status"] in {"STARTED", "QUEUED"} for r in dev.runs()), 300.0)
            before_kill = {r["runId"]: r["status"] for r in dev.runs()}
            dev.kill_daemon_and_wait()
            dev.start()
            time.sleep(3 * HEARTBEAT_S)
        finally:
            stop_producing.set()
            producer.join(60)
        assert not producer.is_alive()
        marks = wait_for("progress after the restart", lambda: committed_at_high(resource), DRAIN_TIMEOUT_S, 5.0)
        assert_all_produced(stream, marks)
        runs = ended_runs(dev)
        failed = {r["runId"]: r["status"] for r in runs if r["status"] != "SUCCESS"}
        print(f"runs: {len(runs)} ({len(before_kill)} before the kill); not successful: {failed}")
        print(f"{stream.written} records in {time.monotonic() - started:.0f} s", flush=True)
        assert not failed
        assert_exactly_once(dev.materializations(ASSET), marks)
    finally:
        dev.stop()
    assert_secret_absent(stream.secret, [home, log], runs)
