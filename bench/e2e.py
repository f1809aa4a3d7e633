"""The example end to end under ``dagster dev``: how long draining a backlog takes against a raw consumer.

``python -m bench.e2e [--records 200000] [--partitions 8] [--members 3] [--max-records-per-run 100000]
[--warmup-records 8000] [--spark connect|local] [--overhead-repeats 3] [--memory-runs 100] [--timeout 1800]``

1. the local broker and an empty topic of ``--partitions`` partitions;
2. ``per_run_overhead_s``: Spark's fixed cost of a run (session + first 1,000-record Python Data Source
   read, in a new process), classic ``local[2]`` and over the local Spark Connect server
   (``dagster_streamgroup.local.spark_connect``), median of ``--overhead-repeats``;
3. ``dagster dev`` with the example project (3 member sensors, PySpark runs writing Parquet) starts on a fresh
   instance, and its members share the shards (``startup_s``); ``--warmup-records`` events are drained
   (``warmup_s``: a deployment's first runs also pay for its Spark server compiling these queries); then
   ``--records`` clickstream events arrive, and ``drain_s`` is the time from the end of producing until
   Kafka's group offsets reach the high watermarks; the run timeline and the CPU each part spent are printed;
4. ``connect_server_rss_mb_after_100_runs``: after the drain, ``--memory-runs`` more runs of the
   ``per_run_overhead_s`` kind, one after another on the same Connect server, with the server tree's RSS
   sampled every 10 (``connect_server_rss_mb_by_run``): its memory stays bounded over many runs;
5. ``raw_consumer_s``: one confluent-kafka consumer reads the same backlog (the project's range reader, in
   this process).

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from bench.spark_overhead import consecutive_runs, mib, run_process
from dagster_streamgroup.dagster import KafkaStreamGroup
from dagster_streamgroup.dagster.devserver import DagsterDev, wait_for
from dagster_streamgroup.local import procfs
from dagster_streamgroup.local.kafka_broker import running_broker
from dagster_streamgroup.local.kafka_data import create_topics
from dagster_streamgroup.streams.kafka import PartitionRange, read_ranges
from jobs.clickstream_events import produce_burst, producers

ASSET = "page_views_per_minute"
PARTS = (
    (b"dagster._daemon", "daemon"),
    (b"dagster_webserver", "webserver"),
)
"""Command-line fragments of ``dagster dev``'s processes, by role; the rest is the code server, its sensor ticks
and the run processes it starts (whose CPU moves to it when they exit)."""


def raw_consumer_seconds(
    bootstrap: str, topic: str, starts: dict[str, int], highs: dict[str, int]
) -> tuple[float, int]:
    ranges = [
        PartitionRange(topic, int(shard.rsplit(":", 1)[1]), starts.get(shard, 0), high) for shard, high in highs.items()
    ]
    pa.array([0])  # pyarrow's first conversion in a process imports pandas (a second or more): not reading time
    started = time.perf_counter()
    records = sum(batch.num_rows for batch in read_ranges({"bootstrap.servers": bootstrap}, ranges))
    return time.perf_counter() - started, records


def probe(target: list[str]) -> float:
    """One new process: session + first read of 1,000 rows through a Python Data Source."""
    return float(run_process(target)["overhead_s"])


def of_backlog(run: dict[str, Any], starts: dict[str, int]) -> bool:
    """Whether a run reads the backlog (its range starts at or after the warm-up's end in its shard)."""
    tags = run["tags"]
    shard, start = tags.get("streamgroup/shard"), tags.get("streamgroup/start")
    return shard in starts and start is not None and int(start) >= starts[shard]


def run_timings(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Where a run's time goes, as Dagster recorded it: queued (created until its process started) and
    running (process start until success), medians over the finished runs."""
    finished = [r for r in runs if r.get("startTime") and r.get("endTime")]
    if not finished:
        return {}
    return {
        "queued": round(statistics.median(r["startTime"] - r["creationTime"] for r in finished), 2),
        "running": round(statistics.median(r["endTime"] - r["startTime"] for r in finished), 2),
    }


def part_of(pid: int) -> str:
    """Which part of the deployment a process of ``dagster dev``'s tree is, from its command line."""
    command = b" ".join(procfs.cmdline(pid))
    if not command:
        return "gone"
    for needle, part in PARTS:
        if needle in command:
            return part
    return "code_server_and_runs"


def cpu_by_part(roots: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far of each part: the Connect server's tree, the broker, and ``dagster dev``'s processes
    by role."""
    out: dict[str, float] = {}
    for name, root in roots.items():
        for pid, cpu in procfs.tree_cpu_seconds(root).items():
            part = part_of(pid) if name == "dagster_dev" else name
            out[part] = out.get(part, 0.0) + cpu
    return out


def drain(
    args: argparse.Namespace,
    bootstrap: str,
    topic: str,
    remote: str | None,
    work: Path,
    produce: Callable[[int], None],
    cpu_roots: dict[str, int],
) -> tuple[dict[str, Any], dict[str, int]]:
    """``dagster dev`` starts on an empty topic and its members share the shards (``startup_s``); a warm-up of
    ``--warmup-records`` is produced and drained (``warmup_s``: the first runs of a deployment also pay for
    the Spark server's JIT and code generation of these queries); then the backlog is produced, and
    ``drain_s`` runs from the end of producing until Kafka's group offsets reach the high watermarks: how
    fast a running deployment drains a backlog, without the one-off start. Also returns where the backlog
    starts in each shard."""
    group = f"bench_{uuid.uuid4().hex[:8]}"
    home = work / "home"
    env = {
        "CLICKSTREAM_BOOTSTRAP": bootstrap,
        "CLICKSTREAM_TOPIC": topic,
        "CLICKSTREAM_GROUP": group,
        "CLICKSTREAM_MEMBERS": str(args.members),
        "CLICKSTREAM_HEARTBEAT_S": "3",
        "CLICKSTREAM_SESSION_TIMEOUT_S": "10",
        "CLICKSTREAM_MAX_RECORDS_PER_RUN": str(args.max_records_per_run),
        "CLICKSTREAM_OUTPUT": str(work / "output"),
        "CLICKSTREAM_SPARK_MASTER": "local[2]",
    }
    if remote is not None:
        env["CLICKSTREAM_SPARK_REMOTE"] = remote
    resource = KafkaStreamGroup(
        group=group,
        bootstrap_servers=bootstrap,
        topics=[topic],
        store_url=f"sqlite:///{home / 'streamgroup-state.db'}",
        heartbeat_interval_s=3,
        session_timeout_s=10,
    )
    backend = resource.backend()
    shards = backend.shards()

    def shared() -> bool:
        state = resource.member("bench").load()
        return (
            state is not None
            and len(state.members) == args.members
            and len(state.shards) == len(shards)
            and all(shard.owner is not None for shard in state.shards.values())
        )

    dev = DagsterDev(home, env, work / "dagster-dev.log")
    started = time.perf_counter()
    try:
        dev.start()
        ready_s = time.perf_counter() - started
        wait_for("the members to share the shards", shared, args.timeout, 1.0)
        startup_s = time.perf_counter() - started
        print(f"dagster dev ready after {ready_s:.1f} s, shards shared after {startup_s:.1f} s", flush=True)
        warm_started = time.perf_counter()
        produce(args.warmup_records)
        starts = {s: m.high for s, m in backend.watermarks(shards).items()}
        wait_for("the warm-up to drain", lambda: backend.committed(group, shards) == starts, args.timeout, 1.0)
        warmup_s = time.perf_counter() - warm_started
        print(f"warm-up of {args.warmup_records} records drained after {warmup_s:.1f} s", flush=True)
        produce(args.records)
        highs = {s: m.high for s, m in backend.watermarks(shards).items()}
        assert dev.proc is not None
        roots = {**cpu_roots, "dagster_dev": dev.proc.pid}
        cpu_before = cpu_by_part(roots)
        produced, produced_at = time.perf_counter(), time.time()

        def drained() -> bool:
            return backend.committed(group, shards) == highs

        wait_for("the backlog to drain", drained, args.timeout, 1.0)
        drain_s = time.perf_counter() - produced
        cpu_after = cpu_by_part(roots)
        runs = [run for run in dev.runs() if of_backlog(run, starts)]
        spark_s = {m["runId"]: (m.get("read_s"), m.get("process_s")) for m in dev.materializations(ASSET)}
    finally:
        dev.stop()
    statuses: dict[str, int] = {}
    for run in runs:
        statuses[run["status"]] = statuses.get(run["status"], 0) + 1
    print(f"drained in {drain_s:.1f} s with {len(runs)} runs {statuses}", flush=True)
    timings = run_timings(runs)
    print(f"run timings (median s): {timings}", flush=True)
    for run in sorted(runs, key=lambda r: r["creationTime"]):
        marks = [run.get(key) for key in ("creationTime", "startTime", "endTime")]
        since = " ".join("-" if mark is None else f"{mark - produced_at:+7.1f}" for mark in marks)
        read_s, process_s = spark_s.get(run["runId"], (None, None))
        print(
            f"  {run['tags'].get('streamgroup/shard', '?'):>24} created/started/ended (s after producing) {since}"
            f"  read {read_s} s, process {process_s} s"
        )
    # Runs still exiting after the drain are not counted yet: a lower bound for that part.
    cpu_s = {part: round(cpu - cpu_before.get(part, 0.0), 1) for part, cpu in sorted(cpu_after.items())}
    print(f"CPU seconds spent during the drain, by part: {cpu_s}", flush=True)
    return {
        "warmup_s": round(warmup_s, 2),
        "drain_cpu_s": cpu_s,
        "run_timings_median_s": timings,
        "drain_s": round(drain_s, 2),
        "startup_s": round(startup_s, 2),
        "ready_s": round(ready_s, 2),
        "runs": len(runs),
        "run_statuses": statuses,
    }, starts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--max-records-per-run", type=int, default=100_000)
    parser.add_argument("--warmup-records", type=int, default=8_000, help="drained before the timed backlog")
    parser.add_argument("--spark", choices=["local", "connect"], default="connect", help="where the runs' Spark runs")
    parser.add_argument("--overhead-repeats", type=int, default=3)
    parser.add_argument(
        "--memory-runs", type=int, default=100, help="consecutive Connect runs after the drain, for the server's RSS"
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="give up draining after this many seconds")
    args = parser.parse_args(argv)
    if min(args.records, args.partitions, args.members, args.max_records_per_run, args.warmup_records) < 1:
        parser.error("--records, --partitions, --members, --max-records-per-run and --warmup-records must be >= 1")
    if args.memory_runs < 0:
        parser.error("--memory-runs must be >= 0")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from dagster_streamgroup.local.spark_connect import running_connect_server

    result: dict[str, Any] = {"records": 0, "partitions": args.partitions, "members": args.members, "spark": args.spark}
    with running_broker() as broker, tempfile.TemporaryDirectory(prefix="bench-e2e-") as tmp:
        topic = f"clicks-{uuid.uuid4().hex[:8]}"
        create_topics(broker.bootstrap, {topic: args.partitions})

        def produce(records: int) -> None:
            bulk, trailer = producers({"bootstrap.servers": broker.bootstrap})
            produce_burst(bulk, trailer, topic, args.partitions, records, random.Random(records))
            del bulk, trailer  # flushed; not left to outlive the broker

        with running_connect_server() as server:
            remote = server.remote
            local = [probe(["--master", "local[2]"]) for _ in range(args.overhead_repeats)]
            connect = [probe(["--remote", remote]) for _ in range(args.overhead_repeats)]
            print(f"per-run Spark overhead: local {local}, connect {connect}", flush=True)
            result["per_run_overhead_s"] = {
                "local": round(statistics.median(local), 3),
                "connect": round(statistics.median(connect), 3),
            }
            remote_or_none = remote if args.spark == "connect" else None
            roots = {"spark_connect_server": server.pid, **({"broker": broker.pid} if broker.pid else {})}
            drained, starts = drain(args, broker.bootstrap, topic, remote_or_none, Path(tmp), produce, roots)
            result.update(drained)
            if args.memory_runs:  # after the drain, so the drain meets the server as a deployment does
                rss_before = mib(procfs.tree_rss_bytes(server.pid))
                _, rss_by_run, rss_at_100 = consecutive_runs(server, args.memory_runs)
                result.update(
                    connect_server_rss_mb_before_runs=rss_before,
                    connect_server_rss_mb_after_100_runs=rss_at_100,
                    connect_server_rss_mb_by_run=rss_by_run,
                )
        backend = KafkaStreamGroup(group="bench", bootstrap_servers=broker.bootstrap, topics=[topic]).backend()
        highs = {s: m.high for s, m in backend.watermarks(backend.shards()).items()}
        raw_s, records = raw_consumer_seconds(broker.bootstrap, topic, starts, highs)
        print(f"{records} backlog records; a raw consumer read them in {raw_s:.2f} s", flush=True)
        result.update(records=records, raw_consumer_s=round(raw_s, 3))
    result["ratio"] = round(result["drain_s"] / result["raw_consumer_s"], 1)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
