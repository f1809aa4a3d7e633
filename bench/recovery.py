"""Recovery from a kill in the middle of a drain, on our side and on the peer's: what reached the sink twice.

    python -m bench.recovery [--records 1000000] [--partitions 32] [--members 3] [--kill-at 0.4]
        [--kill-point committed|written] [--peer-max-offsets-per-trigger 100000] [--max-records-per-run N]
        [--warmup-records 8000] [--timeout 900]

Both sides write the example's page views into the same range-keyed Parquet layout (``range=<topic>-<partition>-
<start>-<end>`` folders, dynamic partition overwrite: a range written again replaces its own folder). A side that
is killed and restarted may read and write some records again; whether they then sit in the sink twice depends on
whether the rewrite has the same range as the first write. This benchmark kills each side once, in the middle of
draining a backlog, restarts it, and counts:

1. the local broker (or ``STREAMGROUP_KAFKA_BOOTSTRAP``), one topic of ``--partitions`` partitions per side, and
   ``--records`` of the example's click events produced onto each (``produce_clicks``);
2. **ours**: the example deployment (``bench.deployment.running_example``: ``dagster dev``, the project's
   ``dagster.yaml`` with run monitoring, its runs' Spark on the local Spark Connect server) starts on its topic
   with ``--members`` member sensors (``--max-records-per-run``: the example's setting, for finer runs),
   drains ``--warmup-records``, and its sensors are stopped (as ``bench.e2e``'s standing start does) while the
   backlog is produced. The sensors start; when Kafka's committed offsets of the group (the group mirrors its
   commits there) cover ``--kill-at`` of the backlog (at the first poll at or past it, every 0.2 s: a wave of
   runs commits many records at once, so the kill may land well past it; ``kill_fraction`` says where), every
   process of ``dagster dev``'s tree is SIGKILLed at once: daemon, webserver, code server, fork servers
   and the run workers in flight (not the Spark Connect server: a write it was doing for a killed run may still
   finish). Then ``dagster dev`` starts again on the same instance and group, and the product has to find the
   killed runs (run monitoring) and have the member sensors run their ranges again, until the group's
   committed offsets equal the high watermarks (at most ``--timeout``; otherwise a failure in the figures);
3. **the peer**: Spark Structured Streaming's Kafka source running the same function
   (``bench.peer_spark_streaming``: ``foreachBatch``, a checkpoint, ``Trigger.AvailableNow``) with
   ``maxOffsetsPerTrigger`` = ``--peer-max-offsets-per-trigger`` (about ten batches for the default backlog),
   in a spawned process. Its whole tree (Python driver, JVM, Python workers) is SIGKILLed as soon as the
   batches committed in its checkpoint (``commits/``, each with its end offsets in ``offsets/``) cover
   ``--kill-at`` of the backlog; the next batch is then in flight (mid-batch, wherever it happens to be: the
   batches run back to back). It then starts again on the same checkpoint and output and its AvailableNow
   query runs to the end;
4. per side, read from the sink with pyarrow (no Spark, ``sink_ranges``/``probe_sink``), over the backlog's
   offsets (``records_expected``: the high watermarks less where the backlog began, per shard):
   ``sink_views`` (the whole sink's), ``lost`` (records of the backlog no range holds), ``duplicated_in_sink``
   (records held by more than one range: per shard, the ranges' lengths less the length of their union) and
   ``reprocessed_records``: records whose range was written before the kill and written again after it,
   from the sink's folders and their Parquet files (names and modification times) just after the kill and at
   the end (a folder replaced, or a new range over offsets an earlier folder holds). Also
   ``restart_to_drained_s`` (from the restart command until drained; for the peer it includes its new Spark
   session) and ``kill_fraction`` (the share of the backlog committed when the kill happened). Ours also
   counts ``ranges_written_between_kill_and_restart`` (a killed run's Spark job goes on in the Connect server
   and may still write its ranges after the kill) and ``reprocessed_records_written_after_kill``, the records
   of those late writes that the restarted deployment wrote again (the sink is read once more just before the
   restart; a late write after that is seen only as a write after the restart), and it reports Dagster's runs
   (created before the kill, in flight at it, created after the restart, by status) and
   when the first run after the restart was created.

``--kill-point committed`` (the default) kills each side there. ``--kill-point written`` waits on, after that point,
until a range's output beyond the committed offsets (ours: Kafka's group offsets; the peer: its checkpoint's
commits) is in the sink, and kills then (polling the sink's folder names every 20 ms, until the side has drained or
``--timeout``; a window that is missed leaves a later kill, and ``ranges_written_uncommitted_at_kill`` says whether
one was caught): the window in which a written range is not yet committed, where at-least-once writes it again. Both
sides write by range with dynamic partition overwrite, so such a range is *reprocessed* (replaced by a write of the
same range), and is *duplicated* only when the second write's range differs.

Progress lines go to stdout and the last line is one JSON object (``ours``, ``peer``, and
``duplicated_in_sink_ours``/``duplicated_in_sink_peer``). Duplicates are a measurement, not a failure: the exit
code is non-zero only when a side did not drain or lost records. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from bench.chaos.check import intersect, merge, size
from bench.deployment import Deployment, ExampleSettings, running_example, statuses
from bench.e2e import stop_members
from bench.peer_follow import checkpoint_committed
from bench.peer_spark_streaming import (
    CHILD_GRACE_S,
    PeerSpec,
    finish_peer_process,
    high_watermarks,
    kafka_broker,
    kill_tree,
    probe_sink,
    produce_clicks,
    range_folders,
    sink_ranges,
    start_peer_process,
)
from dagster_streamgroup.dagster.devserver import wait_for
from dagster_streamgroup.local import procfs

Range = tuple[str, int, int]
"""``(shard, start, end)`` of a sink folder."""
Files = frozenset[tuple[str, int]]
"""A sink folder's Parquet files: ``(name, mtime_ns)``; a folder written again has other names and times."""
Window = tuple[int, int]
"""The backlog's offsets in a shard: ``[start, end)``."""
SESSION_TIMEOUT_S = 300.0
"""The members' session: it outlasts the sensors' pause while the backlog is produced (as ``bench.e2e``)."""
POLL_S = 0.2
PEER_POLL_S = 0.05
WRITTEN_POLL_S = 0.02
"""Polls of the sink's folder names for a range written but not committed (a window of a second or less)."""
RUNS_END_S = 120.0
"""At most this long, after the drain, for the runs to report their end before they are counted."""
KILL_POINTS = ("committed", "written")


# The arithmetic (pure).


def length(intervals: Iterable[Window]) -> int:
    """Offsets in the union of half-open intervals."""
    return size(merge(intervals))


def intersection_length(a: Iterable[Window], b: Iterable[Window]) -> int:
    """Offsets in both unions."""
    return size(intersect(merge(a), merge(b)))


def clipped(ranges: Iterable[Range], windows: Mapping[str, Window]) -> dict[str, list[Window]]:
    """Each shard's ranges cut to its window (ranges of other shards, or outside the window, dropped)."""
    out: dict[str, list[Window]] = {shard: [] for shard in windows}
    for shard, start, end in ranges:
        if shard not in windows:
            continue
        lo, hi = max(start, windows[shard][0]), min(end, windows[shard][1])
        if hi > lo:
            out[shard].append((lo, hi))
    return out


def duplicated_records(ranges: Iterable[Range], windows: Mapping[str, Window]) -> int:
    """Records of the windows held by more than one range, counted once per extra copy: per shard, the
    ranges' lengths less the length of their union."""
    return sum(sum(hi - lo for lo, hi in parts) - length(parts) for parts in clipped(ranges, windows).values())


def lost_records(ranges: Iterable[Range], windows: Mapping[str, Window]) -> int:
    """Records of the windows that no range holds."""
    parts = clipped(ranges, windows)
    return sum(max(0, (hi - lo) - length(parts[shard])) for shard, (lo, hi) in windows.items())


def kill_fraction(windows: Mapping[str, Window], committed: Mapping[str, int | None]) -> float:
    """The share of the windows' records below the committed offsets (an absent or ``None`` offset: none)."""
    total = sum(hi - lo for lo, hi in windows.values())
    done = 0
    for shard, (lo, hi) in windows.items():
        offset = committed.get(shard)
        if offset is not None:
            done += min(max(offset - lo, 0), hi - lo)
    return done / total if total else 1.0


def rewritten(before: Mapping[Range, Files], after: Mapping[Range, Files]) -> list[Range]:
    """The ranges of ``after`` written since ``before``: new folders and folders whose files changed."""
    return sorted(r for r, files in after.items() if before.get(r) != files)


def reprocessed_records(
    before: Mapping[Range, Files], after: Mapping[Range, Files], windows: Mapping[str, Window]
) -> int:
    """Records of the windows written before (a range of ``before``) and written again since (a range of
    ``after`` that is new or whose files changed)."""
    old, new = clipped(before, windows), clipped(rewritten(before, after), windows)
    return sum(intersection_length(old[shard], new[shard]) for shard in windows)


def uncommitted(
    ranges: Iterable[Range], committed: Mapping[str, int | None], windows: Mapping[str, Window]
) -> list[Range]:
    """The ranges of the windows' shards at or beyond the committed offsets (an absent or ``None`` offset: the
    window's start): written, but not committed yet."""
    out = []
    for shard, start, end in ranges:
        if shard in windows:
            offset = committed.get(shard)
            if start >= (windows[shard][0] if offset is None else offset):
                out.append((shard, start, end))
    return sorted(out)


def windows_of(starts: Mapping[str, int], highs: Mapping[str, int]) -> dict[str, Window]:
    """Each shard's backlog ``[start, high)`` (an absent start: 0)."""
    return {shard: (starts.get(shard, 0), high) for shard, high in sorted(highs.items())}


# What is read from the disk and the processes.


def sink_files(output: Path) -> dict[Range, Files]:
    """The sink's range folders with their Parquet files (names and modification times), no Parquet read."""
    out: dict[Range, Files] = {}
    for key, files in range_folders(output):
        with contextlib.suppress(FileNotFoundError):  # a folder being replaced
            out[key] = frozenset((f.name, f.stat().st_mtime_ns) for f in files)
    return out


def sink_figures(
    output: Path,
    windows: Mapping[str, Window],
    at_kill: Mapping[Range, Files],
    expected_from_zero: Mapping[str, int],
) -> dict[str, Any]:
    """A side's sink after its drain: the backlog's records, the views, lost, duplicated and reprocessed ones."""
    final = sink_files(output)
    views = sink_ranges(output)
    probe = probe_sink(output, expected_from_zero)
    again = [r for r in rewritten(at_kill, final) if r[0] in windows]
    return {
        "records_expected": sum(hi - lo for lo, hi in windows.values()),
        "sink_views": sum(views.values()),
        "sink_views_expected": probe["expected"],
        "lost": lost_records(final, windows),
        "duplicated_in_sink": duplicated_records(final, windows),
        "reprocessed_records": reprocessed_records(at_kill, final, windows),
        "ranges": len(final),
        "ranges_at_kill": len(at_kill),
        "ranges_written_after_kill": len(again),
        "probe_ok": probe["ok"],
        "probe_mismatched": probe["mismatched"],
        "probe_overlapping": probe["overlapping"][:20],
    }


def kill_dagster_dev(example: Deployment) -> int:
    """SIGKILL every process of ``dagster dev``'s tree at once (daemon, webserver, code server, fork servers,
    run workers), then its process group for anything that left the tree; returns the group's id (to kill
    again at the end: nothing of it should be left, but nothing must outlive the benchmark)."""
    proc = example.dev.proc
    assert proc is not None
    pgid = proc.pid
    pids = procfs.process_tree(pgid)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(30)
    print(f"SIGKILLed dagster dev's {len(pids)} processes (group {pgid})", flush=True)
    example.dev.proc = None
    return pgid


def active_runs(example: Deployment) -> list[dict[str, Any]]:
    """Runs queued, starting, started or being canceled."""
    return [
        r for r in example.dev.runs() if r["status"] in {"QUEUED", "NOT_STARTED", "STARTING", "STARTED", "CANCELING"}
    ]


def first_after(runs: list[dict[str, Any]], since: float) -> float | None:
    created = [run["creationTime"] for run in runs if run["creationTime"] >= since]
    return round(min(created) - since, 2) if created else None


def ours(args: argparse.Namespace, bootstrap: str, topic: str, work: Path) -> dict[str, Any]:
    """Our side: the deployment drains a standing-start backlog, is killed at ``--kill-at`` and restarted."""
    from dagster_streamgroup.local.spark_connect import running_connect_server

    output = work / "output"
    figures: dict[str, Any] = {"drained": False, "failure": None}
    old_groups: list[int] = []
    try:
        with running_connect_server() as server:
            settings = ExampleSettings(
                members=args.members,
                session_timeout_s=SESSION_TIMEOUT_S,
                max_records_per_run=args.max_records_per_run,
                spark_remote=server.remote,
                deployment=f"bench-{uuid.uuid4().hex[:8]}",
            )
            with running_example(bootstrap, topic, work, settings, args.timeout) as example:
                produce_clicks(bootstrap, topic, args.partitions, args.warmup_records, seed=0)
                warm_s = example.wait_committed("the warm-up to drain", example.highs(), args.timeout)
                print(f"ours: warm-up of {args.warmup_records} records drained after {warm_s:.1f} s", flush=True)
                names, _, _ = stop_members(example, args.timeout)
                starts = example.highs()
                produce_clicks(bootstrap, topic, args.partitions, args.records, seed=args.records)
                highs = example.highs()
                windows = windows_of(starts, highs)
                produced = sum(highs.values()) - sum(starts.values())
                print(f"ours: {produced} records produced, sensors stopped; starting them", flush=True)
                example.start_sensors(names)
                started = time.perf_counter()

                def reached() -> bool:
                    return kill_fraction(windows, example.committed()) >= float(args.kill_at)

                wait_for(f"ours to commit {args.kill_at:g} of the backlog", reached, args.timeout, POLL_S)
                if args.kill_point == "written":

                    def written() -> bool:
                        committed = example.committed()
                        return bool(uncommitted(sink_files(output), committed, windows)) or committed == highs

                    with contextlib.suppress(TimeoutError):
                        wait_for("a run's output written but not committed", written, args.timeout, WRITTEN_POLL_S)
                reached_s = time.perf_counter() - started
                killed_wall = time.time()
                old_groups.append(kill_dagster_dev(example))
                at_kill = sink_files(output)
                committed_at_kill = example.committed()
                fraction = kill_fraction(windows, committed_at_kill)
                print(
                    f"ours: killed {reached_s:.1f} s after the sensors started, at {fraction:.3f} committed",
                    flush=True,
                )
                restart_wall, restarted = time.time(), time.perf_counter()
                at_restart = sink_files(output)
                late = {r: files for r, files in at_restart.items() if at_kill.get(r) != files}
                example.dev.start(args.timeout)
                print(f"ours: dagster dev up again after {time.perf_counter() - restarted:.1f} s", flush=True)
                try:
                    example.wait_committed("ours to drain after the restart", highs, args.timeout, POLL_S)
                    figures["drained"] = True
                    figures["restart_to_drained_s"] = round(time.perf_counter() - restarted, 2)
                    print(f"ours: drained {figures['restart_to_drained_s']} s after the restart", flush=True)
                except TimeoutError as exc:
                    figures["failure"] = str(exc)
                    figures["restart_to_drained_s"] = None
                    figures["committed_fraction_at_timeout"] = round(kill_fraction(windows, example.committed()), 4)
                    print(f"ours: FAILED to drain: {exc}", flush=True)
                with contextlib.suppress(TimeoutError):  # the last runs report their end
                    wait_for("the runs to end", lambda: not statuses(active_runs(example)), RUNS_END_S, 1.0)
                runs = example.dev.runs()
                before = [r for r in runs if r["creationTime"] < killed_wall]
                in_flight = [r for r in before if r.get("endTime") is None or r["endTime"] > killed_wall]
                after = [r for r in runs if r["creationTime"] >= restart_wall]
                figures.update(
                    kill_point=args.kill_point,
                    kill_fraction=round(fraction, 4),
                    kill_after_s=round(reached_s, 2),
                    ranges_written_uncommitted_at_kill=len(uncommitted(at_kill, committed_at_kill, windows)),
                    ranges_written_between_kill_and_restart=len(late),
                    reprocessed_records_written_after_kill=reprocessed_records(late, sink_files(output), windows),
                    runs_before_kill=len(before),
                    runs_in_flight_at_kill=len(in_flight),
                    runs_in_flight_at_kill_now=statuses(in_flight),
                    runs_after_restart=statuses(after),
                    first_run_after_restart_s=first_after(runs, restart_wall),
                )
                figures.update(sink_figures(output, windows, at_kill, highs))
    finally:
        for pgid in old_groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
    return figures


def peer(args: argparse.Namespace, bootstrap: str, topic: str, work: Path, broker_pid: int | None) -> dict[str, Any]:
    """The peer: Spark's Kafka source drains the backlog, is killed at ``--kill-at`` and started again."""
    produce_clicks(bootstrap, topic, args.partitions, args.records, seed=args.records + 1)
    highs = high_watermarks(bootstrap, topic)
    windows = windows_of({}, highs)
    shards = list(highs)
    spec = PeerSpec(
        bootstrap=bootstrap,
        topic=topic,
        work=str(work),
        max_offsets_per_trigger=args.peer_max_offsets_per_trigger,
        timeout_s=args.timeout,
        broker_pid=broker_pid,
    )
    print(f"peer: {sum(highs.values())} records produced; starting its query", flush=True)
    figures: dict[str, Any] = {"drained": False, "failure": None, "kill_point": args.kill_point}
    proc, parent = start_peer_process(spec)
    assert proc.pid is not None
    started = time.perf_counter()
    try:

        def reached() -> bool:
            alive = proc.is_alive()
            return not alive or kill_fraction(windows, checkpoint_committed(spec.checkpoint, topic, shards)) >= float(
                args.kill_at
            )

        wait_for(f"the peer to commit {args.kill_at:g} of the backlog", reached, args.timeout, PEER_POLL_S)
        if not proc.is_alive():
            raise RuntimeError(f"the peer's process ended (code {proc.exitcode}) before the kill point")
        if args.kill_point == "written":

            def written_uncommitted() -> bool:
                committed = checkpoint_committed(spec.checkpoint, topic, shards)
                return not proc.is_alive() or bool(uncommitted(sink_files(spec.output), committed, windows))

            with contextlib.suppress(TimeoutError):
                wait_for("a batch written but not committed", written_uncommitted, args.timeout, WRITTEN_POLL_S)
        kill_tree(proc.pid)
    finally:
        kill_tree(proc.pid)
        proc.join(30)
        parent.close()
    killed_s = time.perf_counter() - started
    at_kill = sink_files(spec.output)
    committed = checkpoint_committed(spec.checkpoint, topic, shards)
    fraction = kill_fraction(windows, committed)
    written_beyond = uncommitted(at_kill, committed, windows)
    print(f"peer: killed {killed_s:.1f} s after its start, at {fraction:.3f} committed", flush=True)
    restarted = time.perf_counter()
    try:
        proc, parent = start_peer_process(spec)
        result = finish_peer_process(proc, parent, args.timeout + CHILD_GRACE_S)
        figures["drained"] = checkpoint_committed(spec.checkpoint, topic, shards) == highs
        figures["restart_to_drained_s"] = round(time.perf_counter() - restarted, 2)
        figures["batches_after_restart"] = result["batches"]
        figures["records_read_after_restart"] = result["records"]
        if not figures["drained"]:
            figures["failure"] = "the restarted query ended before the high watermarks"
        print(f"peer: drained {figures['restart_to_drained_s']} s after the restart", flush=True)
    except (RuntimeError, TimeoutError) as exc:
        figures["failure"] = str(exc)
        figures["restart_to_drained_s"] = None
        print(f"peer: FAILED to drain: {exc}", flush=True)
    figures.update(
        kill_fraction=round(fraction, 4),
        kill_after_s=round(killed_s, 2),
        ranges_written_uncommitted_at_kill=len(written_beyond),
        max_offsets_per_trigger=args.peer_max_offsets_per_trigger,
    )
    figures.update(sink_figures(spec.output, windows, at_kill, highs))
    return figures


def failed(side: Mapping[str, Any]) -> bool:
    return not side.get("drained") or side.get("lost") is None or side["lost"] > 0


def measured(name: str, side: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A side's figures; an error before its figures exist (a kill point never reached, a server that did not
    start) is a failure in the figures, not a traceback instead of them."""
    try:
        figures = side()
    except Exception as exc:
        print(f"{name}: FAILED: {type(exc).__name__}: {exc}", flush=True)
        return {"drained": False, "failure": f"{type(exc).__name__}: {exc}", "lost": None, "duplicated_in_sink": None}
    print(f"{name}: {figures}", flush=True)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=32)
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--kill-at", type=float, default=0.4, help="share of the backlog committed at the kill")
    parser.add_argument("--peer-max-offsets-per-trigger", type=int, default=100_000)
    parser.add_argument(
        "--kill-point",
        choices=KILL_POINTS,
        default="committed",
        help="kill at the first poll past --kill-at, or then once a range is written but not yet committed",
    )
    parser.add_argument(
        "--max-records-per-run", type=int, default=None, help="CLICKSTREAM_MAX_RECORDS_PER_RUN (default: the example's)"
    )
    parser.add_argument("--warmup-records", type=int, default=8_000, help="drained by ours before the backlog")
    parser.add_argument("--timeout", type=float, default=900.0, help="bound of each wait, in seconds")
    args = parser.parse_args(argv)
    for name in ("records", "partitions", "members", "peer_max_offsets_per_trigger", "warmup_records"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if not 0 < args.kill_at < 1:
        parser.error("--kill-at must be within (0, 1)")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from dagster_streamgroup.local.kafka_data import create_topics, delete_topics

    with kafka_broker() as (bootstrap, broker_pid), tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmp:
        suffix = uuid.uuid4().hex[:8]
        topics = {"ours": f"clicks-ours-{suffix}", "peer": f"clicks-peer-{suffix}"}
        create_topics(bootstrap, {topic: args.partitions for topic in topics.values()})
        try:
            our_figures = measured("ours", lambda: ours(args, bootstrap, topics["ours"], Path(tmp) / "ours"))
            peer_figures = measured(
                "peer", lambda: peer(args, bootstrap, topics["peer"], Path(tmp) / "peer", broker_pid)
            )
        finally:
            delete_topics(bootstrap, list(topics.values()))
    result = {
        "records": args.records,
        "partitions": args.partitions,
        "members": args.members,
        "kill_at": args.kill_at,
        "duplicated_in_sink_ours": our_figures["duplicated_in_sink"],
        "duplicated_in_sink_peer": peer_figures["duplicated_in_sink"],
        "ours": our_figures,
        "peer": peer_figures,
    }
    print(json.dumps(result))
    return 1 if failed(our_figures) or failed(peer_figures) else 0


if __name__ == "__main__":
    raise SystemExit(main())
