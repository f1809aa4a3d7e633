"""The example project under a real ``dagster dev`` with the real local broker and local Spark.

200,000 clickstream events over 8 partitions, 3 member sensors. Checked over GraphQL: every run succeeds;
materializations cover every offset of every partition exactly once, contiguously; Kafka's group offsets
equal the high watermarks. Then a member sensor is stopped (its shards are re-owned and progress resumes),
then the daemon is killed mid-stream and started again (nothing lost, nothing committed twice).
"""

from __future__ import annotations

import random
import subprocess
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dagster_streamgroup.dagster import KafkaStreamGroup
from dagster_streamgroup.local.kafka_data import create_topics
from jobs.clickstream_events import produce_burst, producers
from tests.e2e.dagster_dev import ROOT, DagsterDev, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(3600)]

PARTITIONS = 8
MEMBERS = 3
MESSAGES = 200_000
HEARTBEAT_S = 3.0
SESSION_TIMEOUT_S = 10.0
ASSET = "page_views_per_minute"
DRAIN_TIMEOUT_S = 1500.0
"""Generous: on 2 shared cores a Spark run costs tens of seconds (minutes under load) before it reads."""


def produce(bootstrap: str, topic: str, count: int, seed: int) -> None:
    bulk, trailer = producers({"bootstrap.servers": bootstrap})
    produce_burst(bulk, trailer, topic, PARTITIONS, count, random.Random(seed))


def committed_equals_high(resource: KafkaStreamGroup) -> dict[str, int] | None:
    backend = resource.backend()
    shards = backend.shards()
    highs = {s: m.high for s, m in backend.watermarks(shards).items()}
    committed = backend.committed(resource.group, shards)
    return highs if committed == highs else None


def assert_exactly_once(materializations: list[dict[str, Any]], highs: dict[str, int]) -> None:
    """Committed materializations tile [0, high) of every shard: no gap, no overlap, no repeat."""
    spans: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for m in materializations:
        if m.get("backfill"):
            continue
        spans[m["shard"]].append((m["start"], m["end"]))
        assert m["committed"] == m["end"]
    assert sorted(spans) == sorted(highs)
    for shard, ranges in spans.items():
        ranges.sort()
        position = 0
        for start, end in ranges:
            assert start == position, f"{shard}: range [{start}, {end}) after offset {position}"
            position = end
        assert position == highs[shard], f"{shard}: covered up to {position}, high watermark {highs[shard]}"


def assert_runs_succeeded(dev: DagsterDev, allowed_failures: set[str] = frozenset()) -> list[dict[str, Any]]:
    runs = dev.runs()
    bad = [(r["runId"], r["status"]) for r in runs if r["status"] != "SUCCESS" and r["runId"] not in allowed_failures]
    assert not bad, bad
    return runs


@pytest.fixture
def work_dir() -> Iterator[Path]:
    """Not pytest's tmp_path: a concurrent pytest session prunes old basetemps, this instance among them."""
    with tempfile.TemporaryDirectory(prefix="streamgroup-e2e-") as tmp:
        yield Path(tmp)


def test_example_under_dagster_dev(kafka_bootstrap: str, work_dir: Path) -> None:
    tmp_path = work_dir
    topic = f"clicks-{uuid.uuid4().hex[:8]}"
    group = f"e2e_{uuid.uuid4().hex[:8]}"
    create_topics(kafka_bootstrap, {topic: PARTITIONS})
    produce(kafka_bootstrap, topic, MESSAGES, seed=1)
    home = tmp_path / "home"
    env = {
        "CLICKSTREAM_BOOTSTRAP": kafka_bootstrap,
        "CLICKSTREAM_TOPIC": topic,
        "CLICKSTREAM_GROUP": group,
        "CLICKSTREAM_MEMBERS": str(MEMBERS),
        "CLICKSTREAM_HEARTBEAT_S": str(HEARTBEAT_S),
        "CLICKSTREAM_SESSION_TIMEOUT_S": str(SESSION_TIMEOUT_S),
        "CLICKSTREAM_MAX_RECORDS_PER_RUN": "100000",
        "CLICKSTREAM_OUTPUT": str(tmp_path / "output"),
        "CLICKSTREAM_SPARK_MASTER": "local[1]",
    }
    resource = KafkaStreamGroup(
        group=group,
        bootstrap_servers=kafka_bootstrap,
        topics=[topic],
        store_url=f"sqlite:///{home / 'streamgroup-state.db'}",
        heartbeat_interval_s=HEARTBEAT_S,
        session_timeout_s=SESSION_TIMEOUT_S,
    )
    dev = DagsterDev(home, env, tmp_path / "dagster-dev.log")
    try:
        dev.start()

        # 1. The backlog drains: exactly once, contiguous, Kafka offsets at the high watermarks.
        highs = wait_for("the backlog to drain", lambda: committed_equals_high(resource), DRAIN_TIMEOUT_S, 5.0)
        assert sum(highs.values()) == MESSAGES + PARTITIONS
        runs = assert_runs_succeeded(dev)
        assert {r["tags"].get("streamgroup/member") for r in runs} <= {f"{group}_member_{i}" for i in range(MEMBERS)}
        assert_exactly_once(dev.materializations(ASSET), highs)

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
        produce(kafka_bootstrap, topic, 8_000, seed=2)
        highs = wait_for("progress after the stop", lambda: committed_equals_high(resource), DRAIN_TIMEOUT_S, 5.0)
        assert sum(highs.values()) == MESSAGES + 8_000 + 2 * PARTITIONS

        # 3. A backfill from the CLI: listed as a Dagster backfill, re-processes, moves no offset.
        shard = f"{topic}:0"
        command = [str(ROOT / ".venv/bin/streamgroup"), "backfill", "--group", group, "--shard", shard]
        cli = subprocess.run(
            [*command, "--from", "0", "--to", "1000", "--chunk", "500", "--dagster-url", dev.url],
            cwd=ROOT,
            env=dev.env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert cli.returncode == 0, cli.stderr + cli.stdout
        backfill_id = cli.stdout.split()[1].rstrip(":")
        keys = {f"{shard}:0-500", f"{shard}:500-1000"}

        def backfill_done() -> list[dict[str, Any]] | None:
            runs = [r for r in dev.runs() if r["tags"].get("dagster/backfill") == backfill_id]
            done = len(runs) == 2 and all(r["status"] in {"SUCCESS", "FAILURE", "CANCELED"} for r in runs)
            return runs if done else None

        backfill_runs = wait_for("the CLI backfill", backfill_done, DRAIN_TIMEOUT_S, 5.0)
        assert {r["status"] for r in backfill_runs} == {"SUCCESS"}
        assert {r["tags"]["streamgroup/shard"] for r in backfill_runs} == {shard}
        backfilled = [m for m in dev.materializations(ASSET) if m.get("backfill")]
        assert {m["partition"] for m in backfilled} == keys
        assert committed_equals_high(resource) == highs  # offsets did not move

        # 4. The daemon is killed mid-stream and started again.
        stop_producing = threading.Event()

        def keep_producing() -> None:
            seed = 3
            while not stop_producing.is_set():
                produce(kafka_bootstrap, topic, 2_000, seed=seed)
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
        highs = wait_for("progress after the restart", lambda: committed_equals_high(resource), DRAIN_TIMEOUT_S, 5.0)
        runs = dev.runs()
        failed = {r["runId"]: r["status"] for r in runs if r["status"] != "SUCCESS"}
        print(f"runs: {len(runs)} ({len(before_kill)} before the kill); not successful: {failed}")
        assert not failed
        assert_exactly_once(dev.materializations(ASSET), highs)
    finally:
        dev.stop()
