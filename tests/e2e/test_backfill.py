"""``streamgroup backfill`` against a real Dagster deployment in a production host's layout (``dagster api grpc``,
``dagster-daemon run``, ``dagster-webserver``), on the example project and its sink (one Parquet folder per range):

1. the default (aligned) call over a shard with more than 10,000 committed ranges: one Dagster backfill, one run,
   the committed ranges of the span replaced whole, no offset moved;
2. at the same time, a backfill of a shard the group goes on with: the backfill holds the shard's lease, the member
   ticks while records wait and plans no range of the shard meanwhile, and takes the shard back when it ends;
3. a backfill reaching past the group's committed offset (the member sensor stopped, records waiting): stopped at
   the offset, and once the group runs again every record is in the output once.

After each, the output is checked: every range's folder holds its records (one view per record) and no folder
holds records another holds.
"""

from __future__ import annotations

import itertools
import random
import re
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from bench.history import commit_history
from dagster_streamgroup.dagster import KafkaStreamGroup
from jobs.clickstream_events import event
from tests.e2e.dagster_dev import ROOT, DagsterDev, wait_for
from tests.e2e.scenario import (
    ASSET,
    KafkaExample,
    assert_output_counts,
    committed_at_high,
    ended_runs,
    output_views,
)

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(600)]

HISTORY_RANGES = 10_500
RANGE_RECORDS = 3
LIVE_RECORDS = 5_000


@pytest.fixture
def work_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="streamgroup-backfill-") as tmp:
        yield Path(tmp)


def produce(bootstrap: str, topic: str, partition: int, count: int, seed: int) -> None:
    """``count`` clickstream events into one partition."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    rng, now_ms = random.Random(seed), int(time.time() * 1000)
    for i in range(count):
        key, value = event(rng, now_ms)
        producer.produce(topic, value, key, partition=partition)
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0


def backfill(dev: DagsterDev, group: str, shard: str, *args: str) -> subprocess.Popen[str]:
    """``streamgroup backfill`` as an operator runs it beside the deployment, following the backfill to its end."""
    command = [str(ROOT / ".venv/bin/streamgroup"), "backfill", "--group", group, "--shard", shard, *args]
    command += ["--dagster-url", dev.url, "--wait"]
    return subprocess.Popen(command, cwd=ROOT, env=dev.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finished(cli: subprocess.Popen[str]) -> subprocess.CompletedProcess[str]:
    stdout, stderr = cli.communicate(timeout=300)
    print(f"$ streamgroup backfill ...\n{stderr}{stdout}", flush=True)
    return subprocess.CompletedProcess(cli.args, cli.returncode, stdout, stderr)


def one_backfill(dev: DagsterDev, done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The one Dagster backfill a CLI call launched, and its one run, which succeeded."""
    assert done.returncode == 0, done.stderr + done.stdout
    ids = re.findall(r"^backfill ([A-Za-z0-9_-]+) over ", done.stdout, re.MULTILINE)
    assert len(ids) == 1, done.stdout
    runs = [r for r in dev.runs() if r["tags"].get("dagster/backfill") == ids[0]]
    assert [r["status"] for r in runs] == ["SUCCESS"], runs
    return runs[0]


def waves_of(dev: DagsterDev, run_id: str) -> list[dict[str, Any]]:
    return [m for m in dev.materializations(ASSET + "_backfill") if m["runId"] == run_id]


def folders_of(output: Path, shard: str) -> set[str]:
    prefix = "range=" + shard.replace(":", "-") + "-"
    return {p.name for p in output.glob(prefix + "*")}


def assert_each_record_once(output: Path, shard: str, low: int, high: int) -> None:
    """The shard's folders tile ``[low, high)``: each holds its range's records, none overlaps another."""
    spans = sorted(tuple(map(int, name.rsplit("-", 2)[-2:])) for name in folders_of(output, shard))
    assert spans and spans[0][0] == low and spans[-1][1] == high, (spans[:3], spans[-3:], low, high)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans)), "folders overlap or leave a gap"
    assert all(output_views(output, shard, lo, hi) == hi - lo for lo, hi in spans)


def test_backfills_against_a_real_deployment(kafka_bootstrap: str, work_dir: Path) -> None:
    stream = KafkaExample(kafka_bootstrap, work_dir / "home", partitions=2, heartbeat_s=5.0, session_timeout_s=20.0)
    resource: KafkaStreamGroup = stream.resource  # type: ignore[assignment]
    group, topic = resource.group, stream.topic
    history_shard, live_shard = f"{topic}:0", f"{topic}:1"
    produce(kafka_bootstrap, topic, 0, HISTORY_RANGES * RANGE_RECORDS, seed=1)
    produce(kafka_bootstrap, topic, 1, LIVE_RECORDS, seed=2)
    started = time.monotonic()
    history = commit_history(resource, history_shard, range(0, HISTORY_RANGES * RANGE_RECORDS + 1, RANGE_RECORDS))
    print(f"{len(history)} committed ranges of {history_shard} in {time.monotonic() - started:.1f} s", flush=True)
    output = work_dir / "output"
    env = {
        **stream.env,
        "CLICKSTREAM_GROUP": group,
        "CLICKSTREAM_MEMBERS": "1",
        "CLICKSTREAM_HEARTBEAT_S": "5",
        "CLICKSTREAM_SESSION_TIMEOUT_S": "20",
        "CLICKSTREAM_OUTPUT": str(output),
        "CLICKSTREAM_SPARK_MASTER": "local[1]",
        "CLICKSTREAM_MAX_WAIT_S": "1",
        "CLICKSTREAM_MIN_BACKLOG": "1",
    }
    member = f"{group}_member_0"
    with DagsterDev(work_dir / "home", env, work_dir / "dagster.log", layout="services") as dev:
        dev.start()
        marks = wait_for("the live shard's backlog to drain", lambda: committed_at_high(resource), 240.0, 2.0)
        assert marks[live_shard].high == LIVE_RECORDS
        began = time.monotonic()

        # 1. The default aligned call over 10,500 committed ranges (the span's found without a scan of them), and
        # 2. beside it, a backfill of the live shard while the group goes on: the group holds back from the shard.
        lo, hi = 5_000 * RANGE_RECORDS + 1, 5_100 * RANGE_RECORDS + 1  # both cut a committed range
        history_cli = backfill(dev, group, history_shard, "--from", str(lo), "--to", str(hi))
        live_cli = backfill(dev, group, live_shard, "--from", "0", "--to", str(LIVE_RECORDS))
        seen = {"leased": 0, "in_flight_while_leased": 0, "ticks_while_leased": 0, "ticks_during_backfill": 0}
        produced_at: float | None = None
        lease_seen: list[float] = []
        first_heartbeat: float | None = None
        while live_cli.poll() is None:
            state = resource.member("e2e").load()
            shard = None if state is None else state.shards[live_shard]
            heartbeats = [] if state is None else [m.heartbeat for m in state.members.values()]
            if first_heartbeat is None:
                first_heartbeat = max(heartbeats, default=None)
            elif any(h > first_heartbeat for h in heartbeats):
                seen["ticks_during_backfill"] += 1
            if state is not None and shard is not None and shard.lease is not None and shard.lease.granted_at:
                seen["leased"] += 1
                lease_seen.append(time.monotonic())
                seen["in_flight_while_leased"] += shard.inflight is not None
                if produced_at is None:
                    produce(kafka_bootstrap, topic, 1, 500, seed=3)  # records wait while the backfill reads
                    produced_at = max(heartbeats, default=0.0)
                elif any(h > produced_at for h in heartbeats):
                    seen["ticks_while_leased"] += 1
            time.sleep(0.2)
        live = one_backfill(dev, finished(live_cli))
        history_run = one_backfill(dev, finished(history_cli))
        print(f"both backfills done {time.monotonic() - began:.0f} s after their calls: {seen}", flush=True)

        expected = [(s, e) for s, e in history if e > lo and s < hi]
        assert len(expected) == 101 and expected[0][0] < lo and expected[-1][1] > hi
        waves = waves_of(dev, history_run["runId"])
        assert [(w["start"], w["end"], w["ranges"]) for w in waves] == [(expected[0][0], expected[-1][1], 101)]
        assert waves[0]["records"] == expected[-1][1] - expected[0][0]
        assert_output_counts(output, [{"shard": history_shard, "start": s, "end": e} for s, e in expected])
        assert folders_of(output, history_shard) == {
            f"range={history_shard.replace(':', '-')}-{s:012d}-{e:012d}" for s, e in expected
        }, "each committed range's own folder, and no other"

        assert seen["leased"] > 0, "the backfill held the shard's lease while it ran"
        # The member goes on ticking meanwhile. A lease shorter than a few heartbeats (a small backfill on a busy
        # machine: the daemon's ticks come late) may see no tick of its own; a long one must.
        lease_window_s = lease_seen[-1] - lease_seen[0] if lease_seen else 0.0
        assert seen["ticks_during_backfill"] > 0, "the member ticked while the backfill ran"
        if lease_window_s > 4 * 5.0:
            assert seen["ticks_while_leased"] > 0, (
                f"the member ticked while records waited and the backfill held the shard ({lease_window_s:.1f} s)"
            )
        assert seen["in_flight_while_leased"] == 0, "no member range of the shard was in flight meanwhile"
        marks = wait_for("the group to take the shard back", lambda: committed_at_high(resource), 120.0, 2.0)
        assert marks[live_shard].high == LIVE_RECORDS + 500 and marks[history_shard].high == len(history) * 3
        after = [m for m in dev.materializations(ASSET) if m["partition"] == live_shard and m["end"] > LIVE_RECORDS]
        assert after and min(m["at"] for m in after) >= live["endTime"] - 1.0, "planned after the backfill ended"
        assert_each_record_once(output, live_shard, 0, LIVE_RECORDS + 500)

        # 3. Ahead of the group: the member stopped, records waiting past its committed offset.
        dev.stop_sensor(member)
        ended_runs(dev, 120.0)  # the member's run that carried on ends once its member stops heartbeating
        state = resource.member("e2e").load()
        committed = LIVE_RECORDS + 500
        assert state is not None and state.shards[live_shard].inflight is None
        assert state.shards[live_shard].committed == committed
        produce(kafka_bootstrap, topic, 1, 700, seed=4)
        done = finished(backfill(dev, group, live_shard, "--from", str(committed - 100), "--to", str(committed + 700)))
        assert f"past the group's committed offset {committed}: the backfill stops there" in done.stderr
        (wave,) = waves_of(dev, one_backfill(dev, done)["runId"])
        assert wave["end"] == committed, "not a record past the group's offset"
        dev.start_sensor(member)
        marks = wait_for("the group to catch up", lambda: committed_at_high(resource), 180.0, 2.0)
        assert marks[live_shard].high == committed + 700
        assert_each_record_once(output, live_shard, 0, committed + 700)
