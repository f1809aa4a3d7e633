"""The example project's streams and the checks the end-to-end tests make over a real ``dagster dev``."""

from __future__ import annotations

import itertools
import random
import re
import subprocess
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq

from dagster_streamgroup.dagster import KafkaStreamGroup, StreamGroupResource, V3ioStreamGroup
from dagster_streamgroup.local.kafka_data import create_topics
from dagster_streamgroup.local.v3io.testing import V3ioServerInfo
from dagster_streamgroup.streams.base import Watermarks
from jobs.clickstream import range_directory
from jobs.clickstream_events import (
    ensure_v3io_stream,
    produce_burst,
    produce_v3io_burst,
    producers,
    v3io_client,
)
from tests.e2e.dagster_dev import ROOT, DagsterDev, Layout, wait_for
from tests.fixtures.v3io import unique_v3io_name

ASSET = "page_views_per_minute"
"""The stream asset with the example's Parquet sink (``CLICKSTREAM_SINK=parquet``, the settings' default)."""
DELTA_ASSET = "clicks"
"""The stream asset with its Delta sink (``CLICKSTREAM_SINK=delta``); ``page_views_per_minute`` is downstream."""
V3IO_CONTAINER = "bigdata"

MARGIN_TICKS = 3
"""The margin, in member ticks, that every timing bound these tests assert gets on top of the bound the docs
quote (docs/deploying.md): on 2 shared cores the daemon evaluates sensors late, a few seconds per tick."""


def timing_limit_s(bound_s: float, heartbeat_s: float) -> float:
    """A documented bound plus the margin of ``MARGIN_TICKS`` ticks: what a measured time is asserted against."""
    return bound_s + MARGIN_TICKS * heartbeat_s


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
    def __init__(
        self, bootstrap: str, home: Path, partitions: int, heartbeat_s: float = 3.0, session_timeout_s: float = 10.0
    ) -> None:
        self.bootstrap = bootstrap
        self.partitions = partitions
        self.topic = f"clicks-{uuid.uuid4().hex[:8]}"
        group = f"e2e_{uuid.uuid4().hex[:8]}"
        create_topics(bootstrap, {self.topic: partitions})
        self.resource = KafkaStreamGroup(
            group=group,
            bootstrap_servers=bootstrap,
            topics=[self.topic],
            store_url=f"sqlite:///{home / 'streamgroup-state.db'}",
            heartbeat_interval_s=heartbeat_s,
            session_timeout_s=session_timeout_s,
        )
        self.env = {"CLICKSTREAM_STREAM": "kafka", "CLICKSTREAM_BOOTSTRAP": bootstrap, "CLICKSTREAM_TOPIC": self.topic}

    def produce(self, count: int, seed: int) -> None:
        bulk, trailer = producers({"bootstrap.servers": self.bootstrap})
        produce_burst(bulk, trailer, self.topic, self.partitions, count, random.Random(seed))
        self.written += count + self.partitions  # the burst ends with one single-record batch per partition


class V3ioExample(ExampleStream):
    def __init__(
        self, server: V3ioServerInfo, partitions: int, heartbeat_s: float = 3.0, session_timeout_s: float = 10.0
    ) -> None:
        self.key = server.access_key.get_secret_value()
        self.path = unique_v3io_name("clicks")
        self.client = v3io_client(server.endpoint, self.key)
        self.shards = ensure_v3io_stream(self.client, V3IO_CONTAINER, self.path, partitions)
        assert self.shards == partitions
        group = f"e2e_{uuid.uuid4().hex[:8]}"
        self.resource = V3ioStreamGroup(
            group=group,
            endpoint=server.endpoint,
            container=V3IO_CONTAINER,
            stream_path=self.path,
            access_key=self.key,
            store_url="v3io",
            heartbeat_interval_s=heartbeat_s,
            session_timeout_s=session_timeout_s,
        )
        self.env = {
            "CLICKSTREAM_STREAM": "v3io",
            "CLICKSTREAM_V3IO_API": server.endpoint,
            "CLICKSTREAM_V3IO_CONTAINER": V3IO_CONTAINER,
            "CLICKSTREAM_V3IO_STREAM_PATH": self.path,
            "CLICKSTREAM_PARTITIONS": str(partitions),
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


def assert_one_partition_per_shard(materializations: list[dict[str, Any]], marks: dict[str, Watermarks]) -> None:
    """Partition keys stay as few as the shards, however many ranges were committed."""
    assert {m["partition"] for m in materializations} <= set(marks)


def assert_counts_its_range(m: dict[str, Any]) -> None:
    """A range's materialization says its run read every record of it, no fewer: ``records`` (what the read
    counted) is ``end - start`` (these tests produce no transactions, so no offset is a control marker). A
    member's repair of a run killed after its commit carries no count; its output is checked instead."""
    if m.get("repaired"):
        return
    assert m.get("records") == m["end"] - m["start"], (
        f"{m['shard']} [{m['start']}, {m['end']}) of run {m.get('runId')}: {m.get('records')} records read"
    )


def assert_exactly_once(materializations: list[dict[str, Any]], marks: dict[str, Watermarks]) -> None:
    """Committed materializations tile [low, high) of every shard: no gap, no overlap, no repeat; each one
    counted every record of its range."""
    spans: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for m in materializations:
        assert_counts_its_range(m)
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


def output_views(output: Path, shard: str, start: int, end: int) -> int | None:
    """The sum of ``views`` in the example's output folder of one range (``None``: no such folder)."""
    folder = output / f"range={range_directory(shard, start, end)}"
    if not folder.is_dir():
        return None
    return int(pc.sum(pq.read_table(folder, columns=["views"]).column("views")).as_py() or 0)


def assert_output_counts(output: Path, materializations: list[dict[str, Any]]) -> None:
    """The example's output, not our metadata: each materialized range's folder counts exactly its records, one
    view per record (the sum of ``views`` is ``end - start``), so a read that silently dropped records and still
    committed, or output written over another range's, fails here."""
    wrong = []
    for m in materializations:
        views = output_views(output, m["shard"], m["start"], m["end"])
        if views != m["end"] - m["start"]:
            wrong.append(f"{m['shard']} [{m['start']}, {m['end']}): {views} views")
    assert not wrong, f"output folders in {output} that do not hold their range's records: {wrong[:10]}"


IN_PROGRESS = {"QUEUED", "NOT_STARTED", "STARTING", "STARTED", "CANCELING"}


def ended_runs(dev: DagsterDev, timeout_s: float = 180.0) -> list[dict[str, Any]]:
    """Every run, once none is in progress. The offsets reach the high watermarks inside the last run, at
    its commit, a few seconds before that run ends (its events, Spark's stop)."""

    def ended() -> list[dict[str, Any]] | None:
        runs = dev.runs()
        return None if any(r["status"] in IN_PROGRESS for r in runs) else runs

    return wait_for("every run to end", ended, timeout_s, 2.0)


def stream_asset_of(env: dict[str, str]) -> str:
    return DELTA_ASSET if env.get("CLICKSTREAM_SINK") == "delta" else ASSET


def assert_table_counts(clicks: Path, materializations: list[dict[str, Any]]) -> None:
    """The Delta sink's table, not our metadata: each committed range's records have one row each, and the table
    holds no other row (the records of the example's producer are contiguous: no transaction markers)."""
    from deltalake import DeltaTable

    table = DeltaTable(str(clicks)).to_pyarrow_table().select(["topic", "partition", "offset"]).to_pydict()
    rows = Counter(zip(table["topic"], table["partition"], table["offset"], strict=True))
    doubled = [(k, n) for k, n in rows.items() if n > 1]
    assert not doubled, f"records with several rows in {clicks}: {doubled[:10]}"
    expected = set()
    for m in materializations:
        topic, _, partition = m["shard"].rpartition(":")
        expected |= {(topic, int(partition), o) for o in range(m["start"], m["end"])}
    missing, extra = expected - set(rows), set(rows) - expected
    assert not missing and not extra, (
        f"{clicks}: {len(missing)} committed records without a row, {len(extra)} rows of none"
    )


def assert_output(output: Path, env: dict[str, str], materializations: list[dict[str, Any]]) -> None:
    if env.get("CLICKSTREAM_SINK") == "delta":
        assert_table_counts(output / "clicks", [m for m in materializations if not m.get("backfill")])
    else:
        assert_output_counts(output, materializations)


def assert_views_follow_the_clicks(output: Path, timeout_s: float) -> None:
    """The downstream page views (run by Dagster's automation as clicks land) reach the clicks table's latest
    version, and are then a recount of its rows."""
    from deltalake import DeltaTable

    from jobs import page_views

    clicks, views = output / "clicks", output / "page_views_per_minute"
    version = DeltaTable(str(clicks)).version()
    wait_for(
        f"page views to reflect clicks version {version}",
        lambda: (page_views.reflected_version(views) or -1) >= version or None,
        timeout_s,
        2.0,
    )
    rows = DeltaTable(str(clicks)).to_pyarrow_table().select(["page", "minute", "user"]).to_pylist()
    counted: Counter[tuple[str, Any]] = Counter()
    users: defaultdict[tuple[str, Any], set[str]] = defaultdict(set)
    for r in rows:
        counted[(r["page"], r["minute"])] += 1
        users[(r["page"], r["minute"])].add(r["user"])
    assert page_views.views_by_minute(views) == {k: (n, len(users[k])) for k, n in counted.items()}


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


def sensor_of(member_id: str) -> str:
    """The member sensor of a member id (``<sensor>@<deployment>``)."""
    return member_id.partition("@")[0]


def backfill_ids(output: str) -> list[str]:
    """The backfill ids `streamgroup backfill` printed (with its UI address)."""
    return re.findall(r"/runs/b/([A-Za-z0-9_-]+)", output)


def run_example_scenario(
    stream: ExampleStream,
    work_dir: Path,
    *,
    members: int,
    messages: int,
    heartbeat_s: float,
    session_timeout_s: float,
    drain_timeout_s: float,
    backfill: bool,
    extra_env: dict[str, str] | None = None,
    layout: Layout = "dev",
) -> None:
    """The example in a real Dagster deployment (``layout``: ``dagster dev``, or a production host's
    ``dagster api grpc``, ``dagster-daemon run`` and ``dagster-webserver``): a backlog drains exactly once; a
    member sensor stopped over GraphQL leaves and its shards are re-owned within a tick plus the margin;
    optionally a CLI backfill re-processes a range without moving offsets; the daemon is killed mid-stream and
    restarted (the other services stop with it and start again); nothing is lost and nothing
    committed twice, as Dagster's own materializations (over GraphQL), the offsets mirrored into
    the stream and the example's output (every range's folder counts its records) show."""
    resource = stream.resource
    group = resource.group
    stream.produce(messages, seed=1)
    home = work_dir / "home"
    output = work_dir / "output"
    env = {
        **stream.env,
        "CLICKSTREAM_GROUP": group,
        "CLICKSTREAM_MEMBERS": str(members),
        "CLICKSTREAM_HEARTBEAT_S": str(heartbeat_s),
        "CLICKSTREAM_SESSION_TIMEOUT_S": str(session_timeout_s),
        "CLICKSTREAM_OUTPUT": str(output),
        "CLICKSTREAM_SPARK_MASTER": "local[1]",
        **(extra_env or {}),
    }
    asset = stream_asset_of(env)
    log = work_dir / "dagster-dev.log"
    dev = DagsterDev(home, env, log, layout=layout)
    started = time.monotonic()
    runs: list[dict[str, Any]] = []
    try:
        dev.start()

        # 1. The backlog drains: exactly once, contiguous, the stream's offsets at the high watermarks.
        marks = wait_for("the backlog to drain", lambda: committed_at_high(resource), drain_timeout_s, 2.0)
        print(f"backlog of {stream.written} records drained after {time.monotonic() - started:.0f} s", flush=True)
        assert_all_produced(stream, marks)
        runs = assert_runs_succeeded(dev)
        sensors = {f"{group}_member_{i}" for i in range(members)}
        members_of_runs = {
            sensor_of(r["tags"]["streamgroup/member"]) for r in runs if "streamgroup/member" in r["tags"]
        }
        assert members_of_runs <= sensors
        materialized = dev.materializations(asset)
        assert_exactly_once(materialized, marks)
        assert_one_partition_per_shard(materialized, marks)
        assert_output(output, env, materialized)
        print(f"{len(runs)} runs for the backlog", flush=True)

        # 2. A member sensor is stopped: it leaves, its shards are re-owned, progress resumes.
        stopped = f"{group}_member_0"
        dev.stop_sensor(stopped)
        stopped_at = time.monotonic()

        def reowned() -> float | None:
            state = resource.member("e2e").load()
            assert state is not None
            if any(sensor_of(m) == stopped for m in state.members) or any(
                sensor_of(s.owner or "") == stopped for s in state.shards.values()
            ):
                return None
            return time.monotonic() - stopped_at

        # A stopped member sensor leaves at the next tick of a running peer, which hands its shards out in the
        # same write (docs/deploying.md): one tick, plus the margin. The wait is longer so that a slow
        # re-ownership is measured and printed before it fails.
        limit_s = timing_limit_s(heartbeat_s, heartbeat_s)
        reowned_after = wait_for("the stopped member's shards to be re-owned", reowned, 120.0, 1.0)
        print(f"shards of the stopped member re-owned after {reowned_after:.1f} s (limit {limit_s:g} s)", flush=True)
        assert reowned_after <= limit_s, f"re-owned {reowned_after:.1f} s after the stop, past {limit_s:g} s"
        state = resource.member("e2e").load()
        assert state is not None and {sensor_of(m) for m in state.members} == sensors - {stopped}
        stream.produce(max(1_000, messages // 25), seed=2)
        marks = wait_for("progress after the stop", lambda: committed_at_high(resource), drain_timeout_s, 2.0)
        assert_all_produced(stream, marks)

        if backfill:
            # 3. A backfill from the CLI: one Dagster backfill, re-processes whole committed ranges, moves no offset.
            shard = sorted(marks)[0]
            first = marks[shard].low
            committed = [
                (m["start"], m["end"])
                for m in dev.materializations(asset)
                if m["partition"] == shard and not m.get("repaired")
            ]
            delta = env.get("CLICKSTREAM_SINK") == "delta"
            folders_before = set() if delta else {p.name for p in output.iterdir()}  # Parquet: one folder per range
            command = [str(ROOT / ".venv/bin/streamgroup"), "backfill", "--group", group, "--shard", shard]
            command += ["--from", str(first), "--to", str(first + 1000), "--chunk", "500", "--dagster-url", dev.url]

            def cli(*extra: str) -> subprocess.CompletedProcess[str]:
                return subprocess.run(
                    [*command, *extra], cwd=ROOT, env=dev.env, capture_output=True, text=True, timeout=600, check=False
                )

            plan = cli("--dry-run")
            assert plan.returncode == 0, plan.stderr + plan.stdout
            expected = [tuple(map(int, re.findall(r"\d+", line)[-2:])) for line in plan.stdout.splitlines()]
            if delta:  # rows replaced by their coordinates: the span in pieces, not the committed ranges
                assert expected and expected[0][0] == first, expected
                assert all(a[1] == b[0] for a, b in itertools.pairwise(expected)), expected
            else:
                assert expected and all(r in committed for r in expected), (expected, "the committed ranges, whole")
            launched = cli("--wait")
            assert launched.returncode == 0, launched.stderr + launched.stdout
            ids = set(backfill_ids(launched.stdout))
            assert len(ids) == 1, launched.stdout
            backfill_runs = [r for r in dev.runs() if r["tags"].get("dagster/backfill") in ids]
            assert [r["status"] for r in backfill_runs] == ["SUCCESS"], backfill_runs
            assert backfill_runs[0]["tags"]["streamgroup/shard"] == shard
            waves = dev.materializations(asset + "_backfill")
            assert {m["partition"] for m in waves} == {shard} and sum(m["ranges"] for m in waves) == len(expected)
            assert all(m["records"] == m["end"] - m["start"] for m in waves)
            if delta:  # the table holds each committed record once, the backfilled ones included
                assert_output(output, env, dev.materializations(asset))
            else:
                assert_output_counts(output, [{"shard": shard, "start": lo, "end": hi} for lo, hi in expected])
                assert {p.name for p in output.iterdir()} == folders_before, "a backfill replaces, adds no folder"
            assert committed_at_high(resource) == marks  # offsets did not move

        # 4. The daemon is killed mid-stream and started again.
        stop_producing = threading.Event()

        def keep_producing() -> None:
            seed = 3
            while not stop_producing.is_set():
                stream.produce(max(500, messages // 100), seed=seed)
                seed += 1
                stop_producing.wait(1.0)

        producer = threading.Thread(target=keep_producing, daemon=True)
        producer.start()
        try:
            wait_for("a run in progress", lambda: any(r["status"] in {"STARTED", "QUEUED"} for r in dev.runs()), 300.0)
            before_kill = {r["runId"]: r["status"] for r in dev.runs()}
            dev.kill_daemon_and_wait()
            dev.start()
            time.sleep(3 * heartbeat_s)
        finally:
            stop_producing.set()
            producer.join(60)
        assert not producer.is_alive()
        marks = wait_for("progress after the restart", lambda: committed_at_high(resource), drain_timeout_s, 2.0)
        assert_all_produced(stream, marks)
        runs = ended_runs(dev)
        failed = {r["runId"]: r["status"] for r in runs if r["status"] != "SUCCESS"}
        print(f"runs: {len(runs)} ({len(before_kill)} before the kill); not successful: {failed}")
        print(f"{stream.written} records in {time.monotonic() - started:.0f} s", flush=True)
        assert not failed
        materialized = dev.materializations(asset)
        assert_exactly_once(materialized, marks)
        assert_one_partition_per_shard(materialized, marks)
        assert_output(output, env, materialized)
        if env.get("CLICKSTREAM_SINK") == "delta":
            assert_views_follow_the_clicks(output, timeout_s=180.0)
    finally:
        dev.stop()
    assert_secret_absent(stream.secret, [home, log], runs)
