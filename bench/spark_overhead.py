"""Spark's fixed cost per Dagster run: classic ``local[2]`` against the local Spark Connect server.

``python -m bench.spark_overhead [--runs 100] [--local-repeats 3] [--connect-repeats 5] [--isolate-sessions]
[--conf KEY=VALUE]``

Every measured run is a new Python process, as a Dagster run is: it opens a session, registers the probe
Python Data Source and reads 1,000 rows through it (``dagster_streamgroup.local.spark_probe``). Phases:

1. start the Connect server (with its warm-up run) and record its RSS;
2. alternate classic ``local[2]`` runs and Connect runs, ``--local-repeats`` / ``--connect-repeats`` of each;
3. ``--runs`` more consecutive Connect runs, sampling the server tree's RSS every 10 runs;
4. unless ``--kafka-repeats 0``: the same first-read overhead through the project's Kafka source
   (``streamgroup-kafka``), reading offsets [0, 1000) of a one-partition topic on the local broker.

The memory guard is off here, so growth shows instead of being reset. ``--isolate-sessions`` runs the server
as Spark's own launcher does (per-session artifacts and Python daemons) to show the cost this avoids; with it,
keep ``--runs`` small (each run keeps ~400 MiB). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from dagster_streamgroup.local import procfs
from dagster_streamgroup.local.kafka_broker import running_broker
from dagster_streamgroup.local.kafka_data import create_topics, produce_sample
from dagster_streamgroup.local.spark_connect import ConnectServer, ConnectServerSettings, running_connect_server

ROWS = 1000
RUN_TIMEOUT_S = 300.0


def run_process(target: list[str]) -> dict[str, Any]:
    """One run in a new process; adds its wall time as seen from outside (interpreter start and imports)."""
    command = [sys.executable, "-m", "dagster_streamgroup.local.spark_probe", *target, "--rows", str(ROWS)]
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"run {' '.join(target)} failed ({done.returncode}):\n{done.stderr[-3000:]}{done.stdout}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if result["rows"] != ROWS:
        raise SystemExit(f"run {' '.join(target)} read {result['rows']} rows, expected {ROWS}")
    result["wall_s"] = round(wall, 3)
    return result


def consecutive_runs(
    server: ConnectServer, runs: int
) -> tuple[list[dict[str, Any]], list[tuple[int, float]], float | None]:
    """``runs`` Connect runs one after another, each a new process, sampling the server tree's RSS every 10:
    the runs, the samples ``(runs so far, MiB)``, and the RSS after the 100th run (None if fewer)."""
    done: list[dict[str, Any]] = []
    rss_by_run: list[tuple[int, float]] = []
    rss_at_100: float | None = None
    for index in range(1, runs + 1):
        done.append(run_process(["--remote", server.remote]))
        if index % 10 == 0 or index == runs:
            rss = mib(procfs.tree_rss_bytes(server.pid))
            rss_by_run.append((index, rss))
            if index == 100:
                rss_at_100 = rss
            print(
                f"after {index} runs: tree rss {rss} MiB, {len(procfs.process_tree(server.pid))} processes, "
                f"last run {done[-1]}",
                flush=True,
            )
    return done, rss_by_run, rss_at_100


def kafka_phase(server: ConnectServer, repeats: int) -> dict[str, list[dict[str, Any]]]:
    """Alternate Connect and classic runs that read 1,000 records through the Kafka source."""
    runs: dict[str, list[dict[str, Any]]] = {"connect": [], "local": []}
    with running_broker() as broker:
        topic = "spark-overhead"
        create_topics(broker.bootstrap, {topic: 1})
        ends = produce_sample(broker.bootstrap, topic, 1, ROWS)
        print(f"broker {broker.bootstrap}: topic {topic} ends at {ends}", flush=True)
        kafka = ["--kafka-bootstrap", broker.bootstrap, "--kafka-topic", topic]
        for index in range(repeats):
            for mode, target in (("connect", ["--remote", server.remote]), ("local", ["--master", "local[2]"])):
                runs[mode].append(run_process([*target, *kafka]))
                print(f"kafka {mode} run {index + 1}: {runs[mode][-1]}", flush=True)
    return runs


def summary(samples: list[dict[str, Any]], key: str) -> dict[str, float]:
    values = [sample[key] for sample in samples]
    return {"median": round(statistics.median(values), 3), "min": min(values), "max": max(values)}


def mib(value: int) -> float:
    return round(value / 2**20, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=100, help="consecutive Connect runs for the memory figure")
    parser.add_argument("--local-repeats", type=int, default=3)
    parser.add_argument("--connect-repeats", type=int, default=5)
    parser.add_argument("--kafka-repeats", type=int, default=2, help="runs per mode through the Kafka source")
    parser.add_argument("--isolate-sessions", action="store_true", help="Spark's default session isolation")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra server Spark conf")
    args = parser.parse_args(argv)
    for name in ("runs", "local_repeats", "connect_repeats", "kafka_repeats"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0")

    conf = dict(item.split("=", 1) for item in args.conf if "=" in item)
    if len(conf) != len(args.conf):
        parser.error("--conf must be KEY=VALUE")
    load_before = os.getloadavg()
    settings = ConnectServerSettings(isolate_sessions=args.isolate_sessions, rss_limit_mb=None, conf=conf)
    bench_started = time.perf_counter()
    started = time.perf_counter()
    with running_connect_server(settings=settings) as server:
        start_s = time.perf_counter() - started
        rss_start, pss_start = procfs.tree_rss_bytes(server.pid), procfs.tree_pss_bytes(server.pid)
        print(
            f"server {server.remote} pid {server.pid} up and warm in {start_s:.1f} s "
            f"(warm-up run {server.warm_up_result}); tree rss {mib(rss_start)} MiB, pss {mib(pss_start)} MiB",
            flush=True,
        )
        local_runs: list[dict[str, Any]] = []
        connect_runs: list[dict[str, Any]] = []
        for index in range(max(args.local_repeats, args.connect_repeats)):
            if index < args.connect_repeats:
                connect_runs.append(run_process(["--remote", server.remote]))
                print(f"connect run {index + 1}: {connect_runs[-1]}", flush=True)
            if index < args.local_repeats:
                local_runs.append(run_process(["--master", "local[2]"]))
                print(f"local run {index + 1}: {local_runs[-1]}", flush=True)

        memory_runs, rss_by_run, rss_at_100 = consecutive_runs(server, args.runs)
        rss_end, pss_end = procfs.tree_rss_bytes(server.pid), procfs.tree_pss_bytes(server.pid)
        processes_end = len(procfs.process_tree(server.pid))
        kafka_runs = kafka_phase(server, args.kafka_repeats) if args.kafka_repeats else {}

    all_connect = connect_runs + memory_runs
    result: dict[str, Any] = {
        "per_run_overhead_s": {
            "local": summary(local_runs, "overhead_s")["median"] if local_runs else None,
            "connect": summary(connect_runs, "overhead_s")["median"] if connect_runs else None,
        },
        "per_run_overhead_s_kafka_source": {
            mode: summary(runs, "overhead_s")["median"] for mode, runs in kafka_runs.items() if runs
        },
        "connect_server_rss_mb_after_100_runs": rss_at_100,
        "connect_server_rss_mb_start": mib(rss_start),
        "connect_server_rss_mb_after_runs": mib(rss_end),
        "connect_server_pss_mb_start": mib(pss_start),
        "connect_server_pss_mb_after_runs": mib(pss_end),
        "connect_server_processes_after_runs": processes_end,
        "runs": args.runs,
        "rss_mb_by_run": rss_by_run,
        "overhead_s": {
            "local": summary(local_runs, "overhead_s") if local_runs else None,
            "connect": summary(connect_runs, "overhead_s") if connect_runs else None,
            "connect_all_runs": summary(all_connect, "overhead_s") if all_connect else None,
        },
        "steps_median_s": {
            mode: {key: summary(runs, key)["median"] for key in ("session_s", "first_read_s", "wall_s")}
            for mode, runs in (("local", local_runs), ("connect", connect_runs))
            if runs
        },
        "server_start_s": round(start_s, 1),
        "isolate_sessions": args.isolate_sessions,
        "server_conf": conf,
        "rows_per_read": ROWS,
        "load_avg_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "bench_s": round(time.perf_counter() - bench_started, 1),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
