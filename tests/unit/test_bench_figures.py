"""The arithmetic behind the run-economy benchmarks (bench.figures, bench.process_cpu, bench.sustained)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from bench import process_cpu
from bench.e2e import workers_of
from bench.figures import (
    HighWatermarkHistory,
    highest_by_step,
    lag_records,
    oldest_unconsumed_age,
    peak_growth,
    percentile,
    second_half,
    slope,
    sustained,
    target_line,
)
from bench.process_cpu import FORK_SERVER, RUNS, Seen, Worker
from bench.sustained import parse_rates, summary
from dagster_streamgroup.dagster.devserver import wait_for
from dagster_streamgroup.launcher.worker import WORKER_TAG, RunWorker


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([], 50) is None
    assert percentile([7.0], 95) == 7.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile(list(map(float, range(101))), 95) == 95.0
    with pytest.raises(ValueError, match="q: must be within"):
        percentile([1.0], 101)


def test_slope_of_a_line_and_of_too_few_points() -> None:
    assert slope([(0.0, 5.0), (1.0, 7.0), (2.0, 9.0)]) == pytest.approx(2.0)
    assert slope([(1.0, 3.0)]) is None
    assert slope([(1.0, 3.0), (1.0, 4.0)]) is None


def test_second_half_keeps_the_points_after_the_middle() -> None:
    points = [(float(t), float(t)) for t in range(11)]
    assert [t for t, _ in second_half(points, 0.0, 10.0)] == [5.0, 6.0, 7.0, 8.0, 9.0, 10.0]


def test_peak_growth_sees_through_a_sawtooth_and_catches_a_trend() -> None:
    def sawtooth(t: float) -> float:
        return 1000.0 * (t % 40)  # runs every 40 s of a 1,000 records/s stream

    level = [(float(t), sawtooth(t)) for t in range(0, 240, 2)]
    assert peak_growth(level, 0.0, 240.0) == pytest.approx(0.0)
    assert abs(slope(second_half(level, 0.0, 240.0)) or 0.0) > 50  # what a least-squares slope would say
    behind = [(t, y + 300.0 * t) for t, y in level]  # 300 records/s more than the runs take
    assert peak_growth(behind, 0.0, 240.0) == pytest.approx(300.0, rel=0.1)
    assert peak_growth([(0.0, 1.0)], 0.0, 240.0) is None


def test_sustained_within_the_tolerance_of_the_rate() -> None:
    assert sustained(-300.0, 1000, 0.05)
    assert sustained(49.0, 1000, 0.05)
    assert not sustained(51.0, 1000, 0.05)
    assert not sustained(None, 1000, 0.05)


def test_record_age_interpolated_from_the_watermark_history() -> None:
    history = HighWatermarkHistory.empty()
    history.add(10.0, {"t:0": 100})
    history.add(12.0, {"t:0": 300})
    history.add(13.0, {"t:0": 300})  # unchanged: not a new point
    assert history.highs["t:0"] == [100, 300]
    assert history.appeared_at("t:0", 50) == 10.0  # older than the history: its first sample
    assert history.appeared_at("t:0", 199) == pytest.approx(11.0)  # the 100th of 200 records in [10, 12]
    assert history.appeared_at("t:0", 300) is None
    assert oldest_unconsumed_age(history, 20.0, {"t:0": 300}, {"t:0": 199}) == pytest.approx(9.0)
    assert oldest_unconsumed_age(history, 20.0, {"t:0": 300}, {"t:0": 300}) == 0.0


def test_lag_counts_uncommitted_records_of_every_shard() -> None:
    assert lag_records({"a": 10, "b": 5, "c": 3}, {"a": 4, "b": None, "c": 9}) == 6 + 5 + 0


def test_target_lines() -> None:
    assert target_line("runs", 12, 9) == "runs = 12 (target <= 9: not met)"
    assert target_line("rate", 50000, 50000, at_most=False) == "rate = 50000 (target >= 50000: met)"
    assert target_line("x", None, 1) == "x = n/a (target <= 1)"


def test_parse_stat_with_a_command_name_holding_parentheses() -> None:
    ticks = process_cpu.TICKS_PER_S
    fields = ["S", "41", *["0"] * 9, str(3 * ticks), str(ticks), str(2 * ticks), "0", *["0"] * 4, str(50 * ticks)]
    stat = process_cpu.parse_stat(7, f"7 (py (x) y) {' '.join(fields)}")
    assert (stat.ppid, stat.own_s, stat.children_s, stat.started_s) == (41, 4.0, 2.0, 50.0)


@pytest.mark.parametrize(
    ("command", "role"),
    [
        (b"python -m dagster._daemon run", "daemon"),
        (b"python -m dagster_webserver --port 1", "webserver"),
        (b"python -m dagster api grpc --lazy-load-user-code", "code_server"),
        (b"python -c from multiprocessing.spawn import spawn_main", RUNS),
        (b"python -m dagster api execute_run {}", RUNS),
        (b"python -m dagster_streamgroup.launcher.forkserver --fd 5", FORK_SERVER),
        (b"java -cp x org.apache.spark.deploy.SparkSubmit", "spark_in_runs"),
    ],
)
def test_roles_from_command_lines(command: bytes, role: str) -> None:
    assert process_cpu.role_of(command, root=False) == role
    assert process_cpu.role_of(command, root=True) == "dagster_dev"


def test_a_forked_worker_keeps_its_servers_command_line_but_is_a_run() -> None:
    command = b"python -m dagster_streamgroup.launcher.forkserver --fd 5"
    assert process_cpu.role_of(command, root=False, parent_role=FORK_SERVER) == RUNS
    assert process_cpu.role_of(command, root=False, parent_role="daemon") == FORK_SERVER
    assert process_cpu.part_of_role(FORK_SERVER) == process_cpu.CODE_SERVER_AND_RUNS


def seen(
    pid: int,
    started: float,
    parent: tuple[int, float] | None,
    role: str,
    own: tuple[float, float],
    children: tuple[float, float] = (0.0, 0.0),
    own_at_first_child: float | None = None,
    alive: bool = True,
) -> Seen:
    return Seen(pid, started, parent, role, own[0], own[1], children[0], children[1], alive, own_at_first_child)


def ticks(seconds: float) -> int:
    return round(seconds * process_cpu.TICKS_PER_S)


WINDOW = 40.0
CODE = (10, 1.0)
DAEMON = (12, 1.5)
SERVER = (13, 2.0)


def fork_launcher_table() -> dict[tuple[int, float], Seen]:
    """A window of the fork-server launcher: the code server ticks sensors, the daemon creates and launches the
    runs, the fork server (preloaded long before the window) forks three workers; the sampler saw two of them,
    and the fork server reaped all three."""
    w1, w2 = process_cpu.worker_key(20, ticks(50.0)), process_cpu.worker_key(21, ticks(55.0))
    return {
        CODE: seen(10, 1.0, None, "code_server", (30.0, 30.6)),
        DAEMON: seen(12, 1.5, None, "daemon", (8.0, 8.75), children=(0.0, 6.1)),  # reaped an old fork server
        SERVER: seen(13, 2.0, DAEMON, FORK_SERVER, (6.1, 6.13), children=(5.0, 6.2), own_at_first_child=6.0),
        w1: seen(20, w1[1], SERVER, RUNS, (0.05, 0.3), alive=False),  # first seen 0.05 s in: all since the fork
        w2: seen(21, w2[1], SERVER, RUNS, (0.1, 0.4), alive=False),
    }


def fork_workers() -> list[Worker | None]:
    return [
        Worker(20, ticks(50.0), "fork", 13),
        Worker(21, ticks(55.0), "fork", 13),
        Worker(22, ticks(58.0), "fork", 13),  # forked and reaped between two readings: never sampled
    ]


def test_fork_launcher_runs_are_their_tagged_workers_plus_the_tail_and_the_shared_cpu() -> None:
    figures = process_cpu.run_cpu_figures(fork_launcher_table(), WINDOW, fork_workers())
    assert figures.via == {"fork": 3}
    assert (figures.runs, figures.workers_sampled) == (3, 2)
    assert figures.sampled_s == pytest.approx(0.3 + 0.4)
    # The fork server reaped 1.2 s: the three workers' whole CPU. 0.5 s of it was never sampled.
    assert figures.reaped_s == pytest.approx(1.2)
    assert figures.tail_s == pytest.approx(0.5)
    # Readings from the window's start: the server's preload (6.1 s before the window) is not counted.
    assert figures.fork_server_s == pytest.approx(0.03)
    assert figures.fork_server_preload_s == 0.0
    assert figures.code_server_s == pytest.approx(0.6)
    # The daemon's own CPU, which created and launched the runs; not its children's (a fork server it reaped).
    assert figures.daemon_s == pytest.approx(0.75)
    shared = (0.6 + 0.75 + 0.03) / 3
    tail = 0.5 / 3
    assert sorted(figures.per_run_outside_spark_s) == pytest.approx(
        [0.0 + tail + shared, 0.3 + tail + shared, 0.4 + tail + shared]
    )
    # The per-run figures add up to what the workers, the code server, the daemon and the fork server spent.
    assert sum(figures.per_run_outside_spark_s) == pytest.approx(1.2 + 0.6 + 0.75 + 0.03)


def test_a_fork_server_started_in_the_window_has_its_preload_apart() -> None:
    table = fork_launcher_table()
    replaced = (14, 52.0)  # the code changed: a new server loads for 6 s, then forks the last run
    w3 = process_cpu.worker_key(22, ticks(58.0))
    table[replaced] = seen(14, 52.0, DAEMON, FORK_SERVER, (0.0, 6.02), children=(0.0, 0.25), own_at_first_child=6.0)
    table[w3] = seen(22, w3[1], replaced, RUNS, (0.01, 0.2), alive=False)
    table[SERVER].last_children_s = 5.7  # it reaped the first two only
    workers = [*fork_workers()[:2], Worker(22, ticks(58.0), "fork", 14)]
    figures = process_cpu.run_cpu_figures(table, WINDOW, workers)
    assert figures.fork_servers_started == 1
    assert figures.fork_server_preload_s == pytest.approx(6.0)
    assert figures.fork_server_s == pytest.approx(0.03 + 0.02)
    assert figures.tail_s == pytest.approx(0.0 + 0.05)  # each server's reaped CPU against its own runs
    shared = (0.6 + 0.75 + 0.05) / 3
    assert sorted(figures.per_run_outside_spark_s) == pytest.approx([0.25 + shared, 0.3 + shared, 0.4 + shared])


def test_a_worker_that_ran_earlier_runs_counts_its_cpu_over_the_window_split_among_its_runs() -> None:
    """With ``runs_per_worker``, a worker forked before the window runs two of its runs and stays (idle): the
    window's part of its CPU, halved; the other worker was forked in the window and exited; the reaped tail is
    weighed against the exited worker only."""
    table = fork_launcher_table()
    del table[process_cpu.worker_key(21, ticks(55.0))]
    kept = process_cpu.worker_key(19, ticks(30.0))
    table[kept] = seen(19, kept[1], SERVER, RUNS, (2.0, 2.5))  # 2.0 s spent on runs before the window
    table[SERVER].last_children_s = 5.35  # it reaped the two workers that exited: 0.3 sampled, 0.05 missed
    workers = [Worker(19, ticks(30.0), "fork", 13), Worker(19, ticks(30.0), "fork", 13), *fork_workers()[::2]]
    figures = process_cpu.run_cpu_figures(table, WINDOW, workers)
    assert (figures.runs, figures.workers_sampled) == (4, 3)
    assert figures.tail_s == pytest.approx(0.05)
    shared = (0.6 + 0.75 + 0.03) / 4
    tail = 0.05 / 4  # the server's tail, shared by the runs it served
    assert sorted(figures.per_run_outside_spark_s) == pytest.approx(
        [0.0 + tail + shared, 0.25 + tail + shared, 0.25 + tail + shared, 0.3 + tail + shared]
    )


def test_default_launcher_runs_are_the_topmost_processes_the_code_server_started() -> None:
    table = {
        CODE: seen(10, 1.0, None, "code_server", (5.0, 6.0), children=(1.0, 4.5)),
        (20, 50.0): seen(20, 50.0, CODE, RUNS, (0.2, 2.0), alive=False),
        (21, 51.0): seen(21, 51.0, (20, 50.0), RUNS, (0.0, 0.1), alive=False),  # its log tailer
        (22, 52.0): seen(22, 52.0, (20, 50.0), "spark_in_runs", (0.0, 9.0), alive=False),  # a local Spark it started
        (30, 60.0): seen(30, 60.0, CODE, RUNS, (0.3, 1.2), alive=False),
        (5, 0.5): seen(5, 0.5, CODE, RUNS, (0.0, 0.1)),  # a helper started before the window
    }
    assert sorted(process_cpu.run_processes(table, WINDOW)) == [(20, 50.0), (30, 60.0)]
    assert process_cpu.run_cpu(table, (20, 50.0)) == pytest.approx((2.1, 9.0))
    figures = process_cpu.run_cpu_figures(table, WINDOW, [None, None])
    assert figures.via == {"untagged": 2}
    assert figures.local_spark_s == pytest.approx(9.0)
    # Reaped 3.5 s against 2.1 + 9.0 + 1.2 sampled: nothing missed (a Spark process is not reaped here).
    assert figures.tail_s == 0.0
    assert sorted(figures.per_run_outside_spark_s) == pytest.approx([1.2 + 0.5, 2.1 + 0.5])


def test_untagged_runs_never_sampled_get_the_code_servers_tail_and_share() -> None:
    table = {CODE: seen(10, 1.0, None, "code_server", (5.0, 9.0), children=(0.0, 2.0))}
    figures = process_cpu.run_cpu_figures(table, WINDOW, [None] * 4)
    assert figures.per_run_outside_spark_s == pytest.approx([0.5 + 1.0] * 4)


def test_the_sampler_tells_a_fork_server_from_its_workers_and_notes_when_it_first_forked() -> None:
    sampler = process_cpu.TreeSampler(os.getpid())
    sampler.sample()
    assert sampler.seen[(os.getpid(), process_cpu.read_stats()[os.getpid()].started_s)].role == "dagster_dev"
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; sys.stdin.read()", "dagster_streamgroup.launcher.forkserver"],
        stdin=subprocess.PIPE,
    )
    try:
        wait_for("the child to start", lambda: child.pid in process_cpu.read_stats(), 10.0, 0.05)
        sampler.sample()
        me = next(e for e in sampler.seen.values() if e.pid == os.getpid())
        assert me.own_at_first_child_s is not None and me.own_at_first_child_s <= me.last_own_s
        entry = next(e for e in sampler.seen.values() if e.pid == child.pid)
        assert entry.role == FORK_SERVER  # its parent is the root, not a fork server
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(10)
    sampler.sample()
    assert not entry.alive


def test_workers_from_run_tags() -> None:
    tag = RunWorker(host="h", boot_id="b", pid=20, start_ticks=5000, via="fork", server_pid=13).tag()
    runs = [{"tags": tag}, {"tags": {"dagster/run_key": "x"}}, {"tags": {WORKER_TAG: "not json"}}]
    assert workers_of(runs) == [Worker(20, 5000, "fork", 13), None, None]


def phase(target: float, achieved: float, ok: bool, p95: float, cores: float) -> dict[str, object]:
    return {
        "target_events_per_s": target,
        "achieved_events_per_s": achieved,
        "sustained": ok,
        "seconds_behind_p95": p95,
        "deployment_cores": cores,
    }


def test_summary_takes_the_highest_sustained_rate() -> None:
    phases = [phase(1000, 999, True, 4, 0.3), phase(20000, 19900, True, 12, 1.1), phase(50000, 41000, True, 40, 2)]
    # 50,000 asked, 41,000 reached: the phase counts at what the producer reached.
    assert summary(phases) == {
        "max_sustained_events_per_s": 41000,
        "p95_seconds_behind_at_max": 40,
        "p95_seconds_behind_at_50000": 40,
        "cores_at_1000": 0.3,
    }
    phases[2]["sustained"] = False
    assert summary(phases)["max_sustained_events_per_s"] == 20000
    assert summary([phase(20000, 19900, False, 90, 1)]) == {
        "max_sustained_events_per_s": None,
        "p95_seconds_behind_at_max": None,
        "p95_seconds_behind_at_50000": None,
        "cores_at_1000": None,
    }


def test_rates_option() -> None:
    assert parse_rates("1000, 20000") == [1000.0, 20000.0]
    for bad in ("", "fast", "1000,-5"):
        with pytest.raises(argparse.ArgumentTypeError, match="--rates"):
            parse_rates(bad)


def test_highest_by_step_keeps_the_top_of_each_step_in_order() -> None:
    points = [(100.0, 3.0), (104.0, 5.0), (109.9, 1.0), (110.0, 2.0), (131.0, 7.0)]
    assert highest_by_step(points, 100.0, 10.0) == [5.0, 2.0, 7.0]
    assert highest_by_step([], 100.0, 10.0) == []
