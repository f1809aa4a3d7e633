"""The arithmetic of ``bench.newcomer``: per-side figures from the runs, and a side's ratios to the example's."""

from __future__ import annotations

from bench.newcomer import ratios, summarize


def test_a_sides_figures_come_from_its_runs() -> None:
    runs = [
        {"status": "SUCCESS", "creationTime": 100.0, "startTime": 100.4},
        {"status": "SUCCESS", "creationTime": 110.0, "startTime": 110.8},
        {"status": "FAILURE", "creationTime": 120.0, "startTime": 121.5},
        {"status": "QUEUED", "creationTime": 130.0, "startTime": None},
    ]
    figures = summarize(runs, first_s=61.26, drained_s=80.04)
    assert figures == {
        "first_materialization_s": 61.3,
        "drained_s": 80.0,
        "runs": 4,
        "runs_failed": 1,
        "run_start_p50_s": 0.8,
        "run_start_max_s": 1.5,
    }
    assert summarize([], 1.0, 2.0)["run_start_p50_s"] is None


def test_ratios_are_the_side_over_the_example_and_missing_stays_missing() -> None:
    example = {"first_materialization_s": 40.0, "run_start_p50_s": 0.5, "drained_s": 50.0}
    side = {"first_materialization_s": 50.0, "run_start_p50_s": None, "drained_s": 75.0}
    assert ratios(side, example) == {
        "ratio_first_materialization_s": 1.25,
        "ratio_run_start_p50_s": None,
        "ratio_drained_s": 1.5,
    }
