"""The example end to end in a Dagster deployment: draining a backlog against one Spark job, Spark Structured
Streaming's own Kafka source (the peer users would pick instead of us) and a raw consumer.

``python -m bench.e2e [--records 2000000] [--partitions 32] [--members 3] [--max-records-per-run N]
[--warmup-records RECORDS] [--spark connect|local] [--layout services|dev] [--idle-seconds 20] [--drains 3]
[--overhead-repeats 3] [--single-job-repeats 3] [--memory-runs 100] [--cpu-interval 0.5] [--heartbeat 3]
[--session-timeout 300] [--[no-]overlapped] [--[no-]peer] [--sink parquet|delta] [--timeout 1800]``

``--sink delta``: the example with its Delta sink (``CLICKSTREAM_SINK=delta``: each click's row, with its source
coordinates, committed by each run into a Delta table partitioned by day; the page views' automation sensor
stopped, so the runs timed are the stream's), and the peer's ``foreachBatch`` appending the same rows to a Delta
table of its own with Delta's idempotent-write transaction (``bench.peer_spark_streaming.ClickRowsToDelta``); the
probe then reads both tables (every record once) and reports their data files after the drain (``files``).

1. the local broker and an empty topic of ``--partitions`` partitions;
2. ``per_run_overhead_s``: Spark's fixed cost of a run (session + first 1,000-record Python Data Source
   read, in a new process), classic ``local[2]`` and over the local Spark Connect server
   (``dagster_streamgroup.local.spark_connect``), median of ``--overhead-repeats``;
3. the example deployment (``bench.deployment``: the project's ``dagster.yaml``, the example's member sensors
   and stream asset; ``--layout services``, the processes a production host runs as services and
   docs/deploying.md describes: ``dagster api grpc`` serving the code location, ``dagster-daemon run`` and
   ``dagster-webserver`` pointed at it; ``--layout dev``, ``dagster dev``, whose code server sits behind a
   reloading proxy) starts on a fresh instance and its members share the shards
   (``startup_s``); ``--warmup-records`` events are drained (``warmup_s``: a deployment's first runs also
   pay for its Spark server compiling these queries). By default as many as ``--records``: every side meets
   its timed backlog warm at full size, as the single job does after its warm-up call over the whole backlog
   (a Connect server's first 2,000,000-record job took about twice the CPU and time of the next one); once
   its runs exited, the deployment idles ``--idle-seconds`` with its member sensors ticking and its own CPU
   is read (``idle_deployment``: the code server (with its proxy under ``dagster dev``), the daemon, the fork
   servers, ms per s; the webserver is read, not counted);
4. **the backlog from a standing start**, as the single job meets it: the member sensors are stopped over
   GraphQL (as a user stops them in the UI) and their last ticks and runs end; ``--records`` clickstream
   events arrive (``produce_s``); then the sensors start, and ``drain_s`` runs from their start until Kafka's
   group offsets reach the high watermarks; this is done ``--drains`` times, one backlog after another.
   The members tick every ``--heartbeat`` seconds (3; Dagster's daemon passes every 5 s at the fastest, so 5 s
   in effect), their ``heartbeat_interval_s``. Their session (``--session-timeout``, 300 s) outlasts
   the pause, so they start as a group that kept its shards, not with a rebalance. The backlog's runs are
   those Dagster created from the start until then: ``runs``, ``launch_p50_s`` (median of run created to
   run started, from the run records' create_timestamp and start_time as GraphQL serves them) and
   ``run_cpu_s_outside_spark``: the median over the runs of the CPU spent by the run's own worker process
   (with its non-Spark children), plus its share of the code server's, the daemon's and the fork servers'
   own CPU over the window (the daemon creates and launches the runs). The worker is the process a run's
   ``streamgroup/run_worker`` tag names (``ForkServerRunLauncher``: PID and start time; a forked child of
   the fork server), or, for a launcher that tags none (Dagster's default), a topmost process the code
   server started in the window. It is **sampled** from ``/proc`` every ``--cpu-interval`` while it lives;
   the CPU of its last interval, which the sampling misses, is added back from its parent's **children's
   accounting** (the fork server or the code server reaps it: their ``cutime`` gains the worker's whole
   CPU), split equally over that parent's runs. A worker that ran earlier runs and stays for the next
   (the launcher's ``runs_per_worker`` above 1) counts with its CPU over the window, split among
   the window's runs it ran, read once it has gone idle (its CPU still for a second). Its first run, outside
   the timed drains, paid for the copy of the fork server's memory a new process makes (docs/launcher.md).
   Readings start when the window opens, so a fork server's
   preload (before it) is not counted; a fork server started during the window (code changed, location
   reloaded) has its preload printed apart. ``spark_connect_server_cpu_s_per_run``: the Connect server's
   CPU over the window divided by the runs, a figure of its own (the work the runs send there). Over the
   drains: ``drain_s`` is the median drain, ``run_cpu_s_outside_spark`` and ``launch_p50_s`` the medians over
   all their runs, ``runs`` the most any drain took; each drain's figures are in ``standing_starts`` (a drain
   has a few runs, and the same code's runs spread from one drain to the next by more than most changes);
   ``run_cpu_s_outside_spark_over_idle``, for the breakdown only, is that median with each run's share of the
   idle deployment's CPU over its drain's window taken off (``idle_share_per_run_s_each``); the same shared
   parts are read while the backlog is produced, the member sensors stopped and no run
   (``deployment_sensors_stopped`` in each drain's figures), and ``sensors_stopped_share_per_run_s_each`` is
   that rate over each drain's window per run: what Dagster's processes cost a run with no member ticking;
5. **the peer** (``--no-peer`` skips it): Spark Structured Streaming's Kafka source running the example's
   function (``bench.peer_spark_streaming``: ``foreachBatch`` over ``spark.readStream.format("kafka")``,
   read_committed, a classic ``local[2]`` session in a process of its own, its own checkpoint and output)
   drains the same standing-start backlog while the deployment is idle: after our drain, with the member
   sensors stopped again (and started again for step 6 if it runs). It reads ``subscribe`` = the topic from
   ``startingOffsets`` = each partition's offset before the backlog was produced, and nothing is produced to
   the topic in between, so its AvailableNow query ends exactly at the backlog's end. It first drains a
   warm-up topic of ``--warmup-records`` (its own checkpoint and output); ``peer_available_now_s`` runs from
   the start of its timed query until that query has terminated (last batch written, offsets committed to
   its checkpoint); ``ratio_peer_available_now = drain_s / peer_available_now_s``. One probe
   (``probe_sink``) reads both sinks: the peer's views per partition must equal the backlog per partition,
   and our deployment's (warm-up and backlog, from offset 0) the high watermarks (``sink_probe``);
6. **the measure before**, for comparison (``--no-overlapped`` skips it): ``--records`` more events arrive
   with the sensors running, and ``drain_overlapped_s`` runs from the end of producing until the offsets
   reach the watermarks; ``first_run_overlapped_s`` is when its first run was created (negative: before
   producing ended, draining part of the backlog before that clock started);
7. ``single_job_s``: the example's user function over the standing-start backlog's ranges (each shard's
   backlog as one range) in ONE warm session of the deployment's kind (``bench.single_job``: the example's
   own Spark resource, so a Connect session on the same server by default), best of
   ``--single-job-repeats`` after a warm-up call, with the deployment stopped;
   ``ratio_single_job = drain_s / single_job_s`` (and ``ratio_single_job_overlapped`` with the measure before);
8. ``connect_server_rss_mb_after_100_runs``: ``--memory-runs`` more runs of the ``per_run_overhead_s`` kind,
   one after another on the same Connect server, with the server tree's RSS sampled every 10
   (``connect_server_rss_mb_by_run``): its memory stays bounded over many runs;
9. ``raw_consumer_s``: one confluent-kafka consumer reads the standing-start backlog (the project's range
   reader, in this process); ``ratio = drain_s / raw_consumer_s``.

Targets are printed next to the figures, never asserted: ratio_single_job <= 2.0, ratio_peer_available_now <= 1.2,
runs <= 3 x members, launch_p50_s <= 1.0, run_cpu_s_outside_spark <= 0.5. The last line is one JSON object.
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from bench import deployment, process_cpu
from bench.deployment import ASSET, DELTA_ASSET, HEARTBEAT_S, Deployment, ExampleSettings, running_example
from bench.figures import median_or_none, rounded, target_line
from bench.peer_spark_streaming import (
    PeerSpec,
    backlog_by_shard,
    probe_delta,
    probe_sink,
    produce_clicks,
    run_peer_in_subprocess,
)
from bench.single_job import single_job_seconds
from bench.spark_overhead import consecutive_runs, mib, run_process
from dagster_streamgroup.dagster.devserver import wait_for
from dagster_streamgroup.dagster.resources import release_cached_clients
from dagster_streamgroup.launcher.worker import WORKER_TAG, RunWorker
from dagster_streamgroup.local import procfs
from dagster_streamgroup.local.kafka_broker import running_broker
from dagster_streamgroup.local.kafka_data import create_topics, delete_topics
from dagster_streamgroup.spark.ranges import ShardRange
from dagster_streamgroup.streams.kafka import PartitionRange, parse_shard, read_ranges
from jobs.clickstream_events import produce_burst, producers

SESSION_TIMEOUT_S = 300.0
"""Default of ``--session-timeout``: the members' session outlasts the pause in which the backlog is produced
with their sensors stopped (2,000,000 records take some tens of seconds on a loaded machine)."""
COMMIT_POLL_S = 0.5
"""How often the drains read Kafka's group offsets: the drains' figures are this precise."""


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


def run_label(tags: dict[str, str]) -> str:
    """What a run says about itself in its ``streamgroup/`` tags (member, and shard on a run of one), for the
    timeline only: the benchmark selects runs by time, whatever their tags."""
    shown = sorted(
        (k, v)
        for k, v in tags.items()
        if k.startswith("streamgroup/") and not k.endswith(("group", "key")) and k != WORKER_TAG
    )
    return " ".join(f"{k.removeprefix('streamgroup/')}={v}" for k, v in shown)


def print_timeline(runs: list[dict[str, Any]], origin: float, done: dict[str, list[dict[str, Any]]], what: str) -> None:
    """Each run's created/started/ended marks (seconds after ``origin``, when ``what``) and what its
    materializations say it read and how long its Spark read and its user function took."""
    for run in sorted(runs, key=lambda r: r["creationTime"]):
        marks = [run.get(key) for key in ("creationTime", "startTime", "endTime")]
        since = " ".join("-" if mark is None else f"{mark - origin:+7.1f}" for mark in marks)
        ms = done.get(run["runId"], [])
        records = sum(int(m.get("records") or 0) for m in ms)
        read = (
            f"{len(ms)} materializations, {records} records, session {ms[0].get('session_s')} s, "
            f"process {ms[0].get('process_s')} s"
            if ms
            else "no materialization"
        )
        print(f"  {run_label(run['tags']):<60} created/started/ended (s after {what}) {since}  {read}")


def workers_of(runs: list[dict[str, Any]]) -> list[process_cpu.Worker | None]:
    """Each run's worker as its ``streamgroup/run_worker`` tag names it (None: the launcher tags none). The
    benchmark still selects runs by time; the tag only says which process ran each."""
    out: list[process_cpu.Worker | None] = []
    for run in runs:
        tag = RunWorker.from_tags(run["tags"])
        out.append(None if tag is None else process_cpu.Worker(tag.pid, tag.start_ticks, tag.via, tag.server_pid))
    return out


def worker_keys(
    sampler: process_cpu.TreeSampler, runs: list[dict[str, Any]], since_boot: float
) -> list[tuple[int, float]]:
    """The sampler's keys of the runs' worker processes: tagged ones, and for untagged runs the topmost run
    processes started since ``since_boot``."""
    workers = workers_of(runs)
    keys = [process_cpu.worker_key(w.pid, w.start_ticks) for w in workers if w is not None]
    if any(w is None for w in workers):
        keys += process_cpu.run_processes(sampler.snapshot(), since_boot)
    return keys


def finished(
    example: Deployment,
    sampler: process_cpu.TreeSampler,
    since_wall: float,
    since_boot: float,
    until_wall: float,
    timeout_s: float,
) -> tuple[list[dict[str, Any]], bool]:
    """The runs created in ``[since_wall, until_wall)`` once Dagster recorded their end, and whether their
    processes (started after ``since_boot``) have exited, or gone idle for their next run, too (waited for up to
    a minute more)."""

    def ended() -> list[dict[str, Any]] | None:
        runs = example.runs_created(since_wall, until_wall)
        return runs if all(run.get("endTime") for run in runs) else None

    runs = wait_for("the runs to end", ended, timeout_s, 1.0)
    exited = process_cpu.wait_until_exited(sampler, worker_keys(sampler, runs, since_boot), 60.0)
    return runs, exited


@dataclass(frozen=True)
class Backlog:
    """Where a timed backlog starts and ends in each shard, and the figures of its drain (with the unrounded
    per-run CPU and launch times, which the figures over several drains are taken from)."""

    starts: dict[str, int]
    highs: dict[str, int]
    figures: dict[str, Any]
    run_cpu_s: list[float]
    launch_s: list[float]
    connect_cpu_s: float | None
    window_s: float
    """From the sensors' start until the last reading of the runs' processes (after they exited)."""
    sensors_stopped_per_s: float
    """The shared parts' CPU a second while the backlog was produced: the sensors stopped, no run."""


STOP_ATTEMPTS = 3


def stop_members(example: Deployment, timeout_s: float) -> tuple[list[str], int, float]:
    """Stop every member sensor of the example (its only sensors), wait until their ticks have ended, and
    check that the group kept its members and their shards; the sensors' names, the attempts it took and
    when the last one began (epoch seconds).

    A member sensor makes a peer stopped in Dagster leave at its next tick. The sensors are stopped in one
    request just after a daemon pass, so no tick should see some stopped and others running; should one
    have (a member left), the sensors start again, the members share the shards again, and the stop is
    tried again."""
    names = sorted(example.sensors())
    if not names:
        raise RuntimeError("the example has no sensors to stop")
    for attempt in range(1, STOP_ATTEMPTS + 1):
        since = time.time()
        example.stop_sensors(names, timeout_s)
        if example.shared() and not example.membership_changes(since):
            return names, attempt, since
        print(f"stopping the sensors changed the group: {example.membership_changes(since)}; again", flush=True)
        example.start_sensors(names)
        wait_for("the members to share the shards again", example.shared, timeout_s, 1.0)
    raise RuntimeError(f"the member sensors could not be stopped without changing the group ({STOP_ATTEMPTS} tries)")


def standing_start(
    args: argparse.Namespace,
    example: Deployment,
    produce: Callable[[int], None],
    cpu_roots: dict[str, int],
    warm: tuple[process_cpu.TreeSampler, float, float],
) -> Backlog:
    """The backlog from a standing start, as ``single_job_s`` meets it: the member sensors are stopped (and
    the warm-up's runs have ended), ``--records`` events are produced, then the sensors start and ``drain_s``
    runs from just before the start request until Kafka's group offsets reach the high watermarks.

    With the sensors running while the backlog arrives, the deployment drains part of it before producing
    ends (the first wave of runs used to be created 4.6-9.4 s before, holding about half the backlog), so a
    clock started at the end of producing leaves that work out; the single job has none of that head start.
    The group's session timeout must outlast the pause (``--session-timeout``), or the members would evict
    each other on their first ticks and start with a rebalance instead of a drain.

    The backlog's runs are those Dagster created from the start until the drain; CPU is counted from the
    start until those runs' processes have exited."""
    warm_sampler, warm_wall, warm_boot = warm
    members, stop_attempts, stopped_wall = stop_members(example, args.timeout)
    # A tick begun before the stop may have launched runs: they end before the backlog arrives.
    finished(example, warm_sampler, warm_wall, warm_boot, time.time(), args.timeout)
    warm_sampler.stop()
    quiet_wall, quiet_boot = time.time(), process_cpu.uptime_s()
    quiet_sampler = process_cpu.TreeSampler(example.pid, args.cpu_interval).start()
    starts = example.highs()
    produce_started = time.perf_counter()
    produce(args.records)
    highs = example.highs()
    produce_s = time.perf_counter() - produce_started
    quiet_sampler.stop()
    stopped = IdleFloor.read(quiet_sampler, quiet_boot, time.perf_counter() - produce_started)
    produced = sum(highs.values()) - sum(starts.values())
    print(f"{produced} records produced in {produce_s:.1f} s, sensors stopped", flush=True)
    print(f"the deployment meanwhile, its member sensors stopped: {stopped.figures()}", flush=True)

    roots = {**cpu_roots, "dagster_dev": example.pid}
    window_wall, window_boot = time.time(), process_cpu.uptime_s()
    sampler = process_cpu.TreeSampler(example.pid, args.cpu_interval).start()
    cpu_before = process_cpu.cpu_by_part(roots)
    started, started_wall = time.perf_counter(), time.time()
    pause_s = started_wall - stopped_wall
    example.start_sensors(members)
    start_mutations_s = time.perf_counter() - started
    example.wait_committed("the backlog to drain", highs, args.timeout, COMMIT_POLL_S)
    drain_s = time.perf_counter() - started
    drained_wall = time.time()
    print(f"drained {drain_s:.1f} s after the {len(members)} member sensors started; its runs end next", flush=True)
    paused_runs = example.runs_created(quiet_wall, started_wall)
    if paused_runs:
        print(f"WARNING: {len(paused_runs)} runs were created while the sensors were stopped", flush=True)
    changes = example.membership_changes(stopped_wall)
    if changes:
        print(f"WARNING: the group changed from the stop to the drain: {changes}", flush=True)
    if pause_s + 3 * args.heartbeat > args.session_timeout:  # their last heartbeat, then the daemon's next pass
        print(
            f"WARNING: the sensors were stopped {pause_s:.0f} s, near or over the session timeout "
            f"({args.session_timeout:g} s): the members may have evicted each other",
            flush=True,
        )

    runs, exited = finished(example, sampler, window_wall, window_boot, drained_wall, args.timeout)
    cpu_after = process_cpu.cpu_by_part(roots)
    sampler.stop()
    window_s = time.time() - window_wall
    done = materializations_of(example, runs)
    counts = deployment.statuses(runs)
    print(f"drained in {drain_s:.1f} s with {len(runs)} runs {counts}", flush=True)
    timings = deployment.run_timings(runs)
    print(f"run timings (median s): {timings}", flush=True)
    print_timeline(runs, started_wall, done, "the sensors started")
    cpu_s = process_cpu.difference(cpu_after, cpu_before)
    print(f"CPU seconds from the sensors' start until the backlog's runs exited, by part: {cpu_s}", flush=True)
    run_cpu = process_cpu.run_cpu_figures(sampler.snapshot(), window_boot, workers_of(runs))
    print_run_cpu(run_cpu, len(runs), exited)
    launches = deployment.launch_seconds(runs)
    connect_s = cpu_s.get("spark_connect_server")
    connect_per_run = rounded(connect_s / len(runs)) if connect_s is not None and runs else None
    figures: dict[str, Any] = {
        "drain_cpu_s": cpu_s,
        "run_timings_median_s": timings,
        "drain_s": round(drain_s, 2),
        "window_s": round(window_s, 2),
        "produce_s": round(produce_s, 2),
        "deployment_sensors_stopped": stopped.figures(),
        "pause_s": round(pause_s, 2),
        "runs_during_pause": len(paused_runs),
        "stop_attempts": stop_attempts,
        "membership_changes": changes,
        "start_mutations_s": round(start_mutations_s, 2),
        "first_run_after_start_s": rounded(min(r["creationTime"] for r in runs) - started_wall) if runs else None,
        "runs": len(runs),
        "run_statuses": counts,
        "launch_p50_s": rounded(median_or_none(launches)),
        "launch_s_max": rounded(max(launches)) if launches else None,
        "run_cpu_s_outside_spark": rounded(median_or_none(run_cpu.per_run_outside_spark_s)),
        "spark_connect_server_cpu_s_per_run": connect_per_run,
        "run_worker": {"via": run_cpu.via, "sampled": run_cpu.workers_sampled},
        "run_cpu": run_cpu_json(run_cpu),
    }
    return Backlog(
        starts, highs, figures, list(run_cpu.per_run_outside_spark_s), launches, connect_s, window_s, stopped.per_s
    )


@dataclass(frozen=True)
class IdleFloor:
    """The deployment's own CPU with its member sensors ticking and no run (the shared parts of
    ``run_cpu_s_outside_spark``: the code server with its proxy, the daemon, the fork servers)."""

    seconds: float
    code_server_s: float
    daemon_s: float
    fork_server_s: float

    @classmethod
    def read(cls, sampler: process_cpu.TreeSampler, since_boot: float, seconds: float) -> IdleFloor:
        """The shared parts' CPU a stopped ``sampler`` read over ``seconds`` in which no run was created."""
        shared = process_cpu.run_cpu_figures(sampler.snapshot(), since_boot, [])
        return cls(seconds, shared.code_server_s, shared.daemon_s, shared.fork_server_s)

    @property
    def per_s(self) -> float:
        return (self.code_server_s + self.daemon_s + self.fork_server_s) / self.seconds

    def figures(self) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 1),
            "cpu_ms_per_s": round(1000 * self.per_s, 1),
            "code_server_ms_per_s": round(1000 * self.code_server_s / self.seconds, 1),
            "daemon_ms_per_s": round(1000 * self.daemon_s / self.seconds, 1),
            "fork_servers_ms_per_s": round(1000 * self.fork_server_s / self.seconds, 1),
        }


def idle_floor(example: Deployment, seconds: float, interval_s: float) -> IdleFloor:
    """What the deployment costs while it has nothing to do, read as the drains read their shared parts: its
    member sensors tick (heartbeats, watermarks, the group state), Dagster's daemons and the code server's
    pollers run, and no run is created (checked). A drain pays this over its whole window whatever its runs do;
    ``run_cpu_s_outside_spark_over_idle`` is what the runs cost on top of it."""
    since_wall, since_boot = time.time(), process_cpu.uptime_s()
    sampler = process_cpu.TreeSampler(example.pid, interval_s).start()
    started = time.perf_counter()
    time.sleep(seconds)
    sampler.stop()
    elapsed = time.perf_counter() - started
    created = example.runs_created(since_wall, time.time())
    if created:
        print(f"WARNING: {len(created)} runs were created while the deployment was to be idle", flush=True)
    floor = IdleFloor.read(sampler, since_boot, elapsed)
    print(f"the deployment idle, its member sensors ticking: {floor.figures()}", flush=True)
    return floor


def over_drains(backlogs: Sequence[Backlog], idle: IdleFloor | None) -> dict[str, Any]:
    """The headline figures over every standing-start drain: ``drain_s`` the median drain,
    ``run_cpu_s_outside_spark`` and ``launch_p50_s`` the median over all the drains' runs (one drain has only a
    few runs, and runs of the same code spread by more than a change worth measuring), ``runs`` the most any
    drain took, ``spark_connect_server_cpu_s_per_run`` the Connect server's CPU over all of them per run. Each
    drain's own figures are in ``standing_starts``. With ``idle``: ``run_cpu_s_outside_spark_over_idle``, the
    same median after each run's share of the idle deployment's CPU over its drain's window is taken off (for
    the breakdown only: the target is on the whole figure). ``sensors_stopped_share_per_run_s_each``: each
    drain's run share of what the same processes cost with the member sensors stopped (read while its backlog
    was produced)."""
    runs = sum(b.figures["runs"] for b in backlogs)
    connect = [b.connect_cpu_s for b in backlogs]
    over_idle: dict[str, Any] = {
        "sensors_stopped_share_per_run_s_each": [
            round(b.sensors_stopped_per_s * b.window_s / len(b.run_cpu_s), 3) if b.run_cpu_s else 0.0 for b in backlogs
        ]
    }
    if idle is not None:
        shares = [idle.per_s * b.window_s / len(b.run_cpu_s) if b.run_cpu_s else 0.0 for b in backlogs]
        over_idle |= {
            "idle_deployment": idle.figures(),
            "idle_share_per_run_s_each": [round(share, 3) for share in shares],
            "run_cpu_s_outside_spark_over_idle": rounded(
                median_or_none([c - share for b, share in zip(backlogs, shares, strict=True) for c in b.run_cpu_s])
            ),
        }
    return {
        "drains": len(backlogs),
        "drain_s": rounded(statistics.median(b.figures["drain_s"] for b in backlogs)),
        "drain_s_each": [b.figures["drain_s"] for b in backlogs],
        "runs": max(b.figures["runs"] for b in backlogs),
        "runs_each": [b.figures["runs"] for b in backlogs],
        "launch_p50_s": rounded(median_or_none([s for b in backlogs for s in b.launch_s])),
        "run_cpu_s_outside_spark": rounded(median_or_none([c for b in backlogs for c in b.run_cpu_s])),
        "run_cpu_s_outside_spark_each": [b.figures["run_cpu_s_outside_spark"] for b in backlogs],
        "spark_connect_server_cpu_s_per_run": (
            rounded(sum(c for c in connect if c is not None) / runs) if runs and None not in connect else None
        ),
        **over_idle,
        "standing_starts": [b.figures for b in backlogs],
    }


def overlapped(args: argparse.Namespace, example: Deployment, produce: Callable[[int], None]) -> dict[str, Any]:
    """The measure before, for comparison: ``--records`` more events arrive while the sensors run, and the
    clock runs from the end of producing until the group's offsets reach the high watermarks. Its runs are
    those created from the start of producing until then; ``first_run_overlapped_s`` is when the first of
    them was created, after the end of producing (negative: before it ended, so part of the backlog was
    drained before the clock started)."""
    sampler = process_cpu.TreeSampler(example.pid, args.cpu_interval).start()
    since_wall, since_boot = time.time(), process_cpu.uptime_s()
    produce(args.records)
    highs = example.highs()
    produced_wall, produced = time.time(), time.perf_counter()
    example.wait_committed("the overlapped backlog to drain", highs, args.timeout, COMMIT_POLL_S)
    drain_s = time.perf_counter() - produced
    runs, _ = finished(example, sampler, since_wall, since_boot, time.time(), args.timeout)
    sampler.stop()
    print(f"overlapped (the measure before): drained {drain_s:.1f} s after producing, {len(runs)} runs", flush=True)
    print_timeline(runs, produced_wall, materializations_of(example, runs), "producing ended")
    first = min((r["creationTime"] for r in runs), default=None)
    return {
        "drain_overlapped_s": round(drain_s, 2),
        "runs_overlapped": len(runs),
        "first_run_overlapped_s": rounded(first - produced_wall) if first is not None else None,
    }


def peer_while_idle(
    args: argparse.Namespace,
    example: Deployment,
    bootstrap: str,
    topic: str,
    backlog: Backlog,
    work: Path,
    broker_pid: int | None,
) -> dict[str, Any]:
    """The peer over the standing-start backlog while the deployment is idle: the member sensors are stopped
    again (the backlog's runs have ended), the peer's warm-up topic is produced, and the peer runs in a process
    of its own from each partition's offset before the backlog (``startingOffsets``) to the topic's end, which is
    the backlog's end: nothing is produced to the topic meanwhile, and that is checked. Then one probe reads
    both sinks. The sensors start again when the measure before follows (``--overlapped``).

    The members' session must outlast this pause too if the measure before follows, or it starts with a
    rebalance; a warning says so."""
    members, _, stopped_wall = stop_members(example, args.timeout)
    if example.highs() != backlog.highs:
        raise RuntimeError("the topic grew past the standing-start backlog: the peer would read other records")
    warmup_topic = f"peer-warmup-{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, {warmup_topic: args.partitions})
    try:
        produce_clicks(bootstrap, warmup_topic, args.partitions, args.warmup_records, seed=1)
        starts = {parse_shard(shard)[1]: backlog.starts.get(shard, 0) for shard in backlog.highs}
        spec = PeerSpec(
            bootstrap=bootstrap,
            topic=topic,
            work=str(work / "peer"),
            warmup_topic=warmup_topic,
            starting_offsets=starts,
            timeout_s=args.timeout,
            broker_pid=broker_pid,
            sink=args.sink,
        )
        peer = run_peer_in_subprocess(spec)
    finally:
        delete_topics(bootstrap, [warmup_topic])
    if args.sink == "delta":  # each side's table: every record once, and its data files after the drain
        peer_probe = probe_delta(spec.output, backlog_by_shard(backlog.starts, backlog.highs))
        ours_probe = probe_delta(Path(example.env["CLICKSTREAM_OUTPUT"]) / "clicks", backlog.highs)
    else:
        peer_probe = probe_sink(spec.output, backlog_by_shard(backlog.starts, backlog.highs))
        ours_probe = probe_sink(example.env["CLICKSTREAM_OUTPUT"], backlog.highs)
    print(f"sink probes: peer {peer_probe}; ours (warm-up and backlog) {ours_probe}", flush=True)
    for side, probe in (("the peer's", peer_probe), ("our deployment's", ours_probe)):
        if not probe["ok"]:
            print(f"WARNING: {side} sink does not hold exactly the records it read: {probe}", flush=True)
    if args.overlapped:
        pause_s = time.time() - stopped_wall
        if pause_s + 3 * args.heartbeat > args.session_timeout:
            print(f"WARNING: the peer's pause ({pause_s:.0f} s) is near or over the session timeout", flush=True)
        example.start_sensors(members)
        wait_for("the members to share the shards again", example.shared, args.timeout, 1.0)
    return {
        "peer_available_now_s": peer["peer_available_now_s"],
        "peer_records": peer["records"],
        "peer_records_per_s": peer["records_per_s"],
        "peer_batches": peer["batches"],
        "peer_cpu_s": peer["cpu_s"],
        "peer_warmup_s": peer["warmup_s"],
        "peer_session_s": peer["session_s"],
        "sink_probe": {"peer": peer_probe, "ours": ours_probe},
    }


def materializations_of(example: Deployment, runs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    ids = {run["runId"] for run in runs}
    done: dict[str, list[dict[str, Any]]] = {}
    asset = DELTA_ASSET if example.env.get("CLICKSTREAM_SINK") == "delta" else ASSET
    for m in example.dev.materializations(asset):
        if m["runId"] in ids:
            done.setdefault(m["runId"], []).append(m)
    return done


def drain(
    args: argparse.Namespace,
    bootstrap: str,
    topic: str,
    remote: str | None,
    work: Path,
    produce: Callable[[int], None],
    cpu_roots: dict[str, int],
) -> tuple[dict[str, Any], dict[str, str], dict[str, int], dict[str, int]]:
    """The example deployment starts on an empty topic and its members share the shards (``startup_s``); a
    warm-up of ``--warmup-records`` is produced and drained (``warmup_s``: the first runs of a deployment also
    pay for the Spark server's JIT and code generation of these queries); then the backlog from a standing
    start (``standing_start``), unless ``--no-peer`` the peer over the same backlog (``peer_while_idle``) and,
    unless ``--no-overlapped``, the measure before (``overlapped``).

    Returns the figures, the example's environment, and where the standing-start backlog starts and ends in
    each shard (the single job and the raw consumer read the same records)."""
    settings = ExampleSettings(
        members=args.members,
        heartbeat_s=args.heartbeat,
        session_timeout_s=args.session_timeout,
        max_records_per_run=args.max_records_per_run,
        spark_remote=remote,
        layout=args.layout,
        sink=args.sink,
        # Member ids fixed from the first tick: ids derived from the instance's storage id can differ on the
        # very first ticks, and a long session timeout would keep those stale members until it ran out.
        deployment=f"bench-{uuid.uuid4().hex[:8]}",
    )
    with running_example(bootstrap, topic, work, settings, args.timeout) as example:
        warm_started, warm_wall, warm_boot = time.perf_counter(), time.time(), process_cpu.uptime_s()
        warm_sampler = process_cpu.TreeSampler(example.pid, args.cpu_interval).start()
        produce(args.warmup_records)
        example.wait_committed("the warm-up to drain", example.highs(), args.timeout)
        warmup_s = time.perf_counter() - warm_started
        print(f"warm-up of {args.warmup_records} records drained after {warmup_s:.1f} s", flush=True)
        idle: IdleFloor | None = None
        if args.idle_seconds:
            finished(example, warm_sampler, warm_wall, warm_boot, time.time(), args.timeout)
            idle = idle_floor(example, args.idle_seconds, args.cpu_interval)
        backlogs: list[Backlog] = []
        quiet = (warm_sampler, warm_wall, warm_boot)
        for number in range(1, args.drains + 1):
            print(f"standing-start drain {number} of {args.drains}", flush=True)
            backlogs.append(standing_start(args, example, produce, cpu_roots, quiet))
            if number < args.drains:  # its runs have exited: the next drain waits for none
                sampler = process_cpu.TreeSampler(example.pid, args.cpu_interval).start()
                quiet = (sampler, time.time(), process_cpu.uptime_s())
        backlog = backlogs[-1]  # the peer, the single job and the raw consumer read the last backlog
        figures: dict[str, Any] = {
            "warmup_s": round(warmup_s, 2),
            "startup_s": round(example.startup_s, 2),
            "ready_s": round(example.ready_s, 2),
            "session_timeout_s": args.session_timeout,
            "heartbeat_s": args.heartbeat,
            **over_drains(backlogs, idle),
        }
        if args.peer:
            figures.update(peer_while_idle(args, example, bootstrap, topic, backlog, work, cpu_roots.get("broker")))
        if args.overlapped:
            figures.update(overlapped(args, example, produce))
        env = example.env
    return figures, env, backlog.starts, backlog.highs


def run_cpu_json(run_cpu: process_cpu.RunCpu) -> dict[str, Any]:
    return {
        "per_run_s": [round(v, 3) for v in sorted(run_cpu.per_run_outside_spark_s)],
        "workers_sampled_s": round(run_cpu.sampled_s, 2),
        "workers_reaped_s": round(run_cpu.reaped_s, 2),
        "tail_s": round(run_cpu.tail_s, 2),
        "code_server_s": round(run_cpu.code_server_s, 2),
        "daemon_s": round(run_cpu.daemon_s, 2),
        "daemon_per_run_s": round(run_cpu.daemon_s / run_cpu.runs, 3) if run_cpu.runs else None,
        "fork_server_s": round(run_cpu.fork_server_s, 2),
        "fork_servers_started": run_cpu.fork_servers_started,
        "fork_server_preload_in_window_s": round(run_cpu.fork_server_preload_s, 2),
        "local_spark_in_runs_s": round(run_cpu.local_spark_s, 2),
    }


def print_run_cpu(run_cpu: process_cpu.RunCpu, runs: int, exited: bool) -> None:
    """The parts of ``run_cpu_s_outside_spark``."""
    n = max(run_cpu.runs, 1)
    print(
        f"run workers: {run_cpu.via} for {runs} runs, {run_cpu.workers_sampled} sampled alive (all exited or idle: "
        f"{exited}); per run CPU s outside Spark "
        f"{[round(v, 3) for v in sorted(run_cpu.per_run_outside_spark_s)]}\n"
        f"  = worker sampled ({run_cpu.sampled_s - run_cpu.local_spark_s:.2f} s in all) "
        f"+ tail the sampling missed ({run_cpu.tail_s:.2f} s: reaped by fork/code server {run_cpu.reaped_s:.2f} s "
        f"less sampled), split over each reaper's runs\n"
        f"  + shared: code server {run_cpu.code_server_s:.2f} s + daemon {run_cpu.daemon_s:.2f} s "
        f"+ fork servers {run_cpu.fork_server_s:.2f} s = {run_cpu.shared_s / n:.3f} s per run\n"
        f"  fork servers started in the window: {run_cpu.fork_servers_started} (preload "
        f"{run_cpu.fork_server_preload_s:.2f} s, not per run); local Spark in runs {run_cpu.local_spark_s:.2f} s",
        flush=True,
    )


def print_targets(result: dict[str, Any], members: int) -> None:
    print("targets (printed, not asserted):", flush=True)
    for line in (
        target_line("ratio_single_job", result.get("ratio_single_job"), 2.0),
        target_line("ratio_peer_available_now", result.get("ratio_peer_available_now"), 1.2),
        target_line("runs", result["runs"], 3 * members),
        target_line("launch_p50_s", result["launch_p50_s"], 1.0),
        target_line("run_cpu_s_outside_spark", result["run_cpu_s_outside_spark"], 0.5),
    ):
        print(f"  {line}", flush=True)
    if "run_cpu_s_outside_spark_over_idle" in result:
        print(
            f"  (of run_cpu_s_outside_spark, the idle deployment's share: {result['idle_share_per_run_s_each']} s "
            f"a run; above idle: {result['run_cpu_s_outside_spark_over_idle']} s)",
            flush=True,
        )
    if "sensors_stopped_share_per_run_s_each" in result:
        print(
            f"  (of it, the same processes with the member sensors stopped: "
            f"{result['sensors_stopped_share_per_run_s_each']} s a run)",
            flush=True,
        )
    if "ratio_single_job_overlapped" in result:
        print(
            f"  (the measure before, clock from the end of producing with the sensors running: drain "
            f"{result['drain_overlapped_s']} s, ratio_single_job_overlapped {result['ratio_single_job_overlapped']})",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--partitions", type=int, default=32)
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument(
        "--max-records-per-run", type=int, default=None, help="CLICKSTREAM_MAX_RECORDS_PER_RUN (default: the example's)"
    )
    parser.add_argument(
        "--warmup-records",
        type=int,
        default=None,
        help="drained (and the peer's warm-up) before the timed backlog (default: --records, a full-size warm-up)",
    )
    parser.add_argument("--spark", choices=["local", "connect"], default="connect", help="where the runs' Spark runs")
    parser.add_argument(
        "--layout",
        choices=["services", "dev"],
        default="services",
        help="how Dagster runs: a production host's services (dagster api grpc, dagster-daemon, dagster-webserver) "
        "or dagster dev",
    )
    parser.add_argument(
        "--drains", type=int, default=3, help="standing-start backlogs drained one after another (figures over all)"
    )
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=20.0,
        help="the deployment's CPU with nothing to do, read over this long after the warm-up (0: not read)",
    )
    parser.add_argument("--overhead-repeats", type=int, default=3)
    parser.add_argument("--single-job-repeats", type=int, default=3, help="timed single-job calls after a warm-up")
    parser.add_argument(
        "--memory-runs", type=int, default=100, help="consecutive Connect runs after the drain, for the server's RSS"
    )
    parser.add_argument("--cpu-interval", type=float, default=0.5, help="seconds between readings of run processes")
    parser.add_argument(
        "--heartbeat",
        type=int,
        default=int(HEARTBEAT_S),
        help="the members' heartbeat_interval_s, their sensors' interval (Dagster ticks them every 5 s at the fastest)",
    )
    parser.add_argument(
        "--session-timeout",
        type=float,
        default=SESSION_TIMEOUT_S,
        help="the members' session timeout (s): it must outlast the pause in which the backlog is produced",
    )
    parser.add_argument(
        "--overlapped",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also drain a second backlog the measure before did (sensors running while it arrives)",
    )
    parser.add_argument(
        "--peer",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also drain the standing-start backlog with Spark Structured Streaming's Kafka source (AvailableNow)",
    )
    parser.add_argument(
        "--sink",
        choices=["parquet", "delta"],
        default="parquet",
        help="the example's output (CLICKSTREAM_SINK): page views per range folder, or each click's row in a Delta "
        "table; the peer writes the same (with delta: through foreachBatch and delta-rs, docs/outputs.md)",
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="give up draining after this many seconds")
    args = parser.parse_args(argv)
    if args.warmup_records is None:
        args.warmup_records = args.records
    for name in ("records", "partitions", "members", "warmup_records", "single_job_repeats", "drains"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.max_records_per_run is not None and args.max_records_per_run < 1:
        parser.error("--max-records-per-run must be >= 1")
    if not (args.idle_seconds == 0 or 5 <= args.idle_seconds <= 300):
        parser.error("--idle-seconds must be 0 or within 5..300")
    if args.memory_runs < 0 or args.overhead_repeats < 0:
        parser.error("--memory-runs and --overhead-repeats must be >= 0")
    if not 0.05 <= args.cpu_interval <= 10:
        parser.error("--cpu-interval must be within 0.05..10 seconds")
    if args.heartbeat < 1:
        parser.error("--heartbeat must be >= 1")
    if args.session_timeout < 2 * args.heartbeat:
        parser.error(f"--session-timeout must be >= {2 * args.heartbeat:g} (two heartbeats)")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from dagster_streamgroup.local.spark_connect import running_connect_server

    result: dict[str, Any] = {
        "records": 0,
        "partitions": args.partitions,
        "members": args.members,
        "spark": args.spark,
        "layout": args.layout,
        "sink": args.sink,
    }
    with running_broker() as broker, tempfile.TemporaryDirectory(prefix="bench-e2e-") as tmp:
        topic = f"clicks-{uuid.uuid4().hex[:8]}"
        create_topics(broker.bootstrap, {topic: args.partitions})

        def produce(records: int) -> None:
            bulk, trailer = producers({"bootstrap.servers": broker.bootstrap})
            produce_burst(bulk, trailer, topic, args.partitions, records, random.Random(records))
            del bulk, trailer  # flushed; not left to outlive the broker

        with running_connect_server() as server:
            remote = server.remote
            if args.overhead_repeats:
                local = [probe(["--master", "local[2]"]) for _ in range(args.overhead_repeats)]
                connect = [probe(["--remote", remote]) for _ in range(args.overhead_repeats)]
                print(f"per-run Spark overhead: local {local}, connect {connect}", flush=True)
                result["per_run_overhead_s"] = {
                    "local": round(statistics.median(local), 3),
                    "connect": round(statistics.median(connect), 3),
                }
            remote_or_none = remote if args.spark == "connect" else None
            roots = {"spark_connect_server": server.pid, **({"broker": broker.pid} if broker.pid else {})}
            drained, env, starts, highs = drain(
                args, broker.bootstrap, topic, remote_or_none, Path(tmp), produce, roots
            )
            result.update(drained)
            ranges = [ShardRange(shard, starts[shard], high) for shard, high in highs.items() if high > starts[shard]]
            # the deployment is stopped: the single job has the machine (and the Connect server) to itself.
            result.update(single_job_seconds(env, ranges, args.single_job_repeats))
            if args.memory_runs:  # after the drain, so the drain meets the server as a deployment does
                rss_before = mib(procfs.tree_rss_bytes(server.pid))
                _, rss_by_run, rss_at_100 = consecutive_runs(server, args.memory_runs)
                result.update(
                    connect_server_rss_mb_before_runs=rss_before,
                    connect_server_rss_mb_after_100_runs=rss_at_100,
                    connect_server_rss_mb_by_run=rss_by_run,
                )
        raw_s, records = raw_consumer_seconds(broker.bootstrap, topic, starts, highs)
        print(f"{records} backlog records; a raw consumer read them in {raw_s:.2f} s", flush=True)
        result.update(records=records, raw_consumer_s=round(raw_s, 3))
        release_cached_clients()  # the deployment's cached stream client must not outlive the broker
    result["ratio"] = round(result["drain_s"] / result["raw_consumer_s"], 1)
    result["ratio_single_job"] = round(result["drain_s"] / result["single_job_s"], 2)
    if result.get("peer_available_now_s"):
        result["ratio_peer_available_now"] = round(result["drain_s"] / result["peer_available_now_s"], 2)
    if "drain_overlapped_s" in result:
        result["ratio_single_job_overlapped"] = round(result["drain_overlapped_s"] / result["single_job_s"], 2)
    print_targets(result, args.members)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
