"""The arithmetic behind the run-economy benchmarks (bench.figures, bench.process_cpu, bench.sustained)."""

from __future__ import annotations

import argparse

import pytest

from bench import process_cpu
from bench.figures import (
    HighWatermarkHistory,
    lag_records,
    oldest_unconsumed_age,
    peak_growth,
    percentile,
    second_half,
    slope,
    sustained,
    target_line,
)
from bench.process_cpu import RUNS, Seen
from bench.sustained import parse_rates, summary


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
        (b"java -cp x org.apache.spark.deploy.SparkSubmit", "spark_in_runs"),
    ],
)
def test_roles_from_command_lines(command: bytes, role: str) -> None:
    assert process_cpu.role_of(command, root=False) == role
    assert process_cpu.role_of(command, root=True) == "dagster_dev"


def seen(pid: int, started: float, parent: tuple[int, float] | None, role: str, own: tuple[float, float]) -> Seen:
    return Seen(pid, started, parent, role, own[0], own[1], 0.0, 0.0)


def test_runs_are_the_topmost_run_processes_started_in_the_window() -> None:
    server = (10, 1.0)
    fork_server = (11, 2.0)  # a launcher process already running when the window opened
    table = {
        server: seen(10, 1.0, None, "code_server", (5.0, 6.0)),
        fork_server: seen(11, 2.0, server, RUNS, (1.0, 1.5)),
        (20, 50.0): seen(20, 50.0, fork_server, RUNS, (0.2, 0.4)),
        (21, 51.0): seen(21, 51.0, (20, 50.0), RUNS, (0.0, 0.1)),  # its log tailer
        (22, 52.0): seen(22, 52.0, (20, 50.0), "spark_in_runs", (0.0, 9.0)),  # a local Spark it started
        (30, 60.0): seen(30, 60.0, server, RUNS, (0.3, 0.6)),
        (5, 0.5): seen(5, 0.5, server, RUNS, (0.0, 0.1)),  # a helper started before the window
    }
    assert sorted(process_cpu.run_processes(table, 40.0)) == [(20, 50.0), (30, 60.0)]
    assert process_cpu.run_cpu(table, (20, 50.0)) == pytest.approx((0.5, 9.0))
    figures = process_cpu.run_cpu_figures(table, 40.0, runs=2)
    shared = (6.0 - 5.0) + (1.5 - 1.0) + 0.1  # the code server's, fork server's and helper's own CPU
    assert figures.shared_s == pytest.approx(shared)
    assert sorted(figures.per_run_outside_spark_s) == pytest.approx([0.5 + shared / 2, 0.6 + shared / 2])
    assert figures.local_spark_s == pytest.approx(9.0)


def test_without_run_processes_each_run_gets_its_share_of_the_code_server() -> None:
    table = {(10, 1.0): seen(10, 1.0, None, "code_server", (5.0, 9.0))}
    assert process_cpu.run_cpu_figures(table, 40.0, runs=4).per_run_outside_spark_s == [1.0] * 4


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
        "cores_at_1000": 0.3,
    }
    phases[2]["sustained"] = False
    assert summary(phases)["max_sustained_events_per_s"] == 20000
    assert summary([phase(20000, 19900, False, 90, 1)]) == {
        "max_sustained_events_per_s": None,
        "p95_seconds_behind_at_max": None,
        "cores_at_1000": None,
    }


def test_rates_option() -> None:
    assert parse_rates("1000, 20000") == [1000.0, 20000.0]
    for bad in ("", "fast", "1000,-5"):
        with pytest.raises(argparse.ArgumentTypeError, match="--rates"):
            parse_rates(bad)
