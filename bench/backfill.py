"""A day of the example's ranges backfilled: one ``streamgroup backfill`` call, as an operator makes it.

``python -m bench.backfill [--ranges 2900] [--records-per-range 1117] [--max-records-per-run 1000000]
[--spark connect|local] [--layout services|dev] [--timeout 1800]``

The example commits about two ranges a minute a shard: at the ``scripts/example.sh`` rate (300 events a second over
8 partitions), about 2,900 ranges of about 1,100 records a shard a day. The benchmark:

1. starts the local broker and a topic of one partition, and writes a day of that shard's clickstream events;
2. commits a day of ranges on it, ``--ranges`` of sizes drawn around ``--records-per-range`` (a member's ranges
   vary with its ticks), through the protocol's plan and commit transitions and the store's range index
   (``bench.history``: what runs leave, without running 2,900 runs first);
3. starts the example deployment (``--layout services``: ``dagster api grpc``, ``dagster-daemon run``,
   ``dagster-webserver``; one member sensor, idle: the shard is committed to its end);
4. calls ``streamgroup backfill --group G --shard <topic>:0 --from 0 --to <end> --wait`` and reads back, over
   GraphQL: the Dagster backfills created since the call, the runs launched for them, their waves (the backfill
   asset's materializations) and the example's output (a folder per range, one view per record).

Figures: ``wall_s`` from the call to the last run's success (its end time as Dagster recorded it);
``cli_s`` from the call to the backfill's id printed (the plan included: ``plan_s``, from the CLI's own report);
``queued_s`` from the id printed to the run started (Dagster's backfill daemon submits a backfill's runs on its
pass, every 30 s); ``waves_process_s``, the Spark work of the waves (their ``process_s``); ``launch_overhead_s`` =
``wall_s`` less that work. Targets (printed, not asserted): one backfill, at most ``ceil(records /
max_records_per_run)`` runs, under a minute of launch overhead.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
from confluent_kafka import Producer

from bench.deployment import ASSET, Deployment, ExampleSettings, running_example
from bench.figures import target_line
from bench.history import commit_history
from dagster_streamgroup.dagster import KafkaStreamGroup
from dagster_streamgroup.dagster.devserver import ROOT
from dagster_streamgroup.dagster.resources import release_cached_clients
from dagster_streamgroup.local.kafka_broker import running_broker
from dagster_streamgroup.local.kafka_data import create_topics
from jobs.clickstream_events import event

BACKFILLS = """{ partitionBackfillsOrError(limit: 100) { ... on PartitionBackfills { results { id timestamp } } } }"""


def produce(bootstrap: str, topic: str, count: int, seed: int) -> None:
    """``count`` clickstream events into partition 0."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.num.messages": 10_000})
    rng, now_ms = random.Random(seed), int(time.time() * 1000)
    for i in range(count):
        key, value = event(rng, now_ms)
        while True:
            try:
                producer.produce(topic, value, key, partition=0)
                break
            except BufferError:
                producer.poll(0.1)
        if i % 50_000 == 0:
            producer.poll(0)
    if producer.flush(120):
        raise TimeoutError("events left undelivered")


def day_of_bounds(ranges: int, per_range: int, seed: int) -> list[int]:
    """Range bounds from 0: ``ranges`` sizes within 30 % of ``per_range``."""
    rng = random.Random(seed)
    bounds = [0]
    for _ in range(ranges):
        bounds.append(bounds[-1] + rng.randint(int(per_range * 0.7), int(per_range * 1.3)))
    return bounds


def timed_cli(command: list[str], env: dict[str, str], timeout_s: float) -> tuple[int, list[tuple[float, str]]]:
    """Run the CLI, keeping when each line of its output (stdout and stderr merged) arrived."""
    lines: list[tuple[float, str]] = []
    with subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    ) as cli:
        assert cli.stdout is not None
        deadline = time.time() + timeout_s
        for line in cli.stdout:
            lines.append((time.time(), line.rstrip()))
            print(f"  | {line.rstrip()}", flush=True)
            if time.time() > deadline:
                cli.kill()
                raise TimeoutError("the backfill did not end in time")
        return cli.wait(), lines


def output_figures(output: Path, shard: str) -> tuple[int, int]:
    """The example's output of the shard: its range folders, and the views they count (one per record)."""
    prefix = "range=" + shard.replace(":", "-") + "-"
    folders = list(output.glob(prefix + "*"))
    views = sum(int(pc.sum(pq.read_table(f, columns=["views"]).column("views")).as_py() or 0) for f in folders)
    return len(folders), views


def measure(example: Deployment, shard: str, records: int, args: argparse.Namespace) -> dict[str, Any]:
    command = [str(ROOT / ".venv/bin/streamgroup"), "backfill", "--group", example.group, "--shard", shard]
    command += ["--from", "0", "--to", str(records), "--dagster-url", example.dev.url, "--wait"]
    called = time.time()
    code, lines = timed_cli(command, example.dev.env, args.timeout)
    if code != 0:
        raise RuntimeError(f"streamgroup backfill exited {code}")
    launched = [(at, text) for at, text in lines if re.match(r"backfill \S+ over ", text)]
    planned = [at for at, text in lines if text.startswith("plan: ")]
    backfill_id = launched[0][1].split()[1]
    backfills = [
        b
        for b in example.dev.graphql(BACKFILLS)["partitionBackfillsOrError"]["results"]
        if float(b["timestamp"]) >= called
    ]
    runs = [r for r in example.dev.runs() if r["tags"].get("dagster/backfill") in {b["id"] for b in backfills}]
    waves = [m for m in example.dev.materializations(ASSET + "_backfill") if m["runId"] in {r["runId"] for r in runs}]
    last_end = max(float(r["endTime"]) for r in runs)
    first_start = min(float(r["startTime"]) for r in runs)
    process_s = sum(float(w["process_s"]) for w in waves)
    folders, views = output_figures(Path(example.env["CLICKSTREAM_OUTPUT"]), shard)
    wall_s = last_end - called
    return {
        "backfill_id": backfill_id,
        "wall_s": round(wall_s, 1),
        "plan_s": round(planned[0] - called, 1) if planned else None,
        "cli_s": round(launched[0][0] - called, 1),
        "queued_s": round(first_start - launched[0][0], 1),
        "run_s": round(last_end - first_start, 1),
        "waves": len(waves),
        "waves_process_s": round(process_s, 1),
        "launch_overhead_s": round(wall_s - process_s, 1),
        "backfills_created": len(backfills),
        "runs_launched": len(runs),
        "runs_succeeded": sum(r["status"] == "SUCCESS" for r in runs),
        "ranges_replaced": sum(int(w["ranges"]) for w in waves),
        "records_reprocessed": sum(int(w["records"]) for w in waves),
        "output_folders": folders,
        "output_views": views,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranges", type=int, default=2_900, help="committed ranges of the shard (a day's)")
    parser.add_argument("--records-per-range", type=int, default=1_117, help="their mean size")
    parser.add_argument("--max-records-per-run", type=int, default=1_000_000, help="the example's, CLICKSTREAM_...")
    parser.add_argument("--spark", choices=["local", "connect"], default="connect", help="where the runs' Spark runs")
    parser.add_argument("--layout", choices=["services", "dev"], default="services")
    parser.add_argument("--timeout", type=float, default=1800.0, help="give up after this many seconds")
    args = parser.parse_args(argv)
    for name in ("ranges", "records_per_range", "max_records_per_run"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from dagster_streamgroup.local.spark_connect import running_connect_server

    bounds = day_of_bounds(args.ranges, args.records_per_range, seed=1)
    records = bounds[-1]
    result: dict[str, Any] = {
        "ranges": args.ranges,
        "records": records,
        "max_records_per_run": args.max_records_per_run,
    }
    with running_broker() as broker, tempfile.TemporaryDirectory(prefix="bench-backfill-") as tmp:
        topic = f"clicks-{uuid.uuid4().hex[:8]}"
        shard = f"{topic}:0"
        create_topics(broker.bootstrap, {topic: 1})
        started = time.perf_counter()
        produce(broker.bootstrap, topic, records, seed=2)
        result["produce_s"] = round(time.perf_counter() - started, 1)
        print(f"{records} events produced in {result['produce_s']} s", flush=True)

        def history(resource: KafkaStreamGroup) -> None:
            began = time.perf_counter()
            commit_history(resource, shard, bounds)
            result["history_s"] = round(time.perf_counter() - began, 1)
            print(f"{args.ranges} committed ranges written in {result['history_s']} s", flush=True)

        with running_connect_server() as server:
            settings = ExampleSettings(
                members=1,
                max_records_per_run=args.max_records_per_run,
                spark_remote=server.remote if args.spark == "connect" else None,
                layout=args.layout,
            )
            with running_example(broker.bootstrap, topic, Path(tmp), settings, args.timeout, history) as example:
                result.update(measure(example, shard, records, args))
        release_cached_clients()  # the deployment's cached stream client must not outlive the broker
    bound = math.ceil(records / args.max_records_per_run)
    print(target_line("backfills_created", result["backfills_created"], 1))
    print(target_line("runs_launched", result["runs_launched"], bound))
    print(target_line("launch_overhead_s", result["launch_overhead_s"], 60))
    print(
        f"ranges replaced {result['ranges_replaced']} of {args.ranges}; output: {result['output_folders']} folders, "
        f"{result['output_views']} views for {records} records"
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
