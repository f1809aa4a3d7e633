"""Steps and materializations per day from runs per minute, and the modelled cycle of a relaxed setting."""

from __future__ import annotations

import json

import pytest

from bench.dagster_plus_cost import (
    BENCHMARKS,
    cycle_s,
    main,
    per_day,
    ranges_per_run,
    runs_per_minute_from_benchmarks,
    runs_per_minute_from_json,
    table_rows,
)


def test_a_day_of_runs_is_its_steps_and_materializations() -> None:
    day = per_day(7.0, materializations_per_run=32 / 3)
    assert day.runs == day.steps == 7.0 * 1440 == 10_080
    assert day.materializations == pytest.approx(107_520)
    assert per_day(2.0, 4, steps_per_run=3).steps == 2 * 1440 * 3
    with pytest.raises(ValueError, match=">= 0"):
        per_day(-1.0, 1)


def test_a_run_holds_one_range_per_owned_shard() -> None:
    assert ranges_per_run(32, 3) == pytest.approx(10.667, abs=1e-3)
    assert ranges_per_run(4, 8) == 1.0, "members beyond the shards own nothing"


def test_the_measured_setting_gives_back_the_measured_cycle() -> None:
    for rate, runs in ((1_000.0, 7.0), (20_000.0, 35.2)):
        assert cycle_s(runs, rate, 3, max_wait_s=15, min_backlog=20_000) == pytest.approx(3 * 60 / runs)


def test_a_longer_wait_lengthens_the_cycle_until_min_backlog_launches_first() -> None:
    # 1,000 events/s over 3 members: 20,000 records wait after 60 s, so max_wait_s beyond 60 s changes nothing.
    assert cycle_s(7.0, 1_000, 3, max_wait_s=30, min_backlog=20_000) == pytest.approx(25.714 + 15, abs=1e-3)
    assert cycle_s(7.0, 1_000, 3, max_wait_s=60, min_backlog=20_000) == pytest.approx(60.0)
    assert cycle_s(7.0, 1_000, 3, max_wait_s=600, min_backlog=20_000) == pytest.approx(60.0)
    assert cycle_s(7.0, 1_000, 3, max_wait_s=60, min_backlog=200_000) == pytest.approx(25.714 + 45, abs=1e-3)


def test_at_a_high_rate_only_min_backlog_trades_latency_for_runs() -> None:
    # 20,000 events/s: min_backlog is reached while a run is in flight, so runs follow each other.
    measured = 3 * 60 / 35.2
    assert cycle_s(35.2, 20_000, 3, max_wait_s=60, min_backlog=20_000) == pytest.approx(measured)
    assert cycle_s(35.2, 20_000, 3, max_wait_s=60, min_backlog=200_000) == pytest.approx(30.0)
    assert cycle_s(35.2, 20_000, 3, max_wait_s=0, min_backlog=0) == pytest.approx(measured), "never before a commit"


def test_the_table_has_the_measured_row_and_the_modelled_ones() -> None:
    rows = table_rows({1_000.0: 7.0, 20_000.0: 35.2}, 32, 3, [(60.0, 20_000), (60.0, 200_000)])
    assert [(r.rate, r.measured) for r in rows] == [
        (1_000.0, True),
        (1_000.0, False),
        (1_000.0, False),
        (20_000.0, True),
        (20_000.0, False),
        (20_000.0, False),
    ]
    assert [round(r.runs_per_minute, 2) for r in rows] == [7.0, 3.0, 2.55, 35.2, 35.2, 6.0]
    assert rows[-1].per_day.materializations == pytest.approx(6.0 * 1440 * 32 / 3)


def test_the_inputs_are_read_from_the_benchmarks_doc_and_from_a_sustained_run() -> None:
    heading, figures = runs_per_minute_from_benchmarks(BENCHMARKS.read_text())
    assert heading.startswith("`bench.sustained` at its defaults")
    assert {1_000.0, 20_000.0} <= set(figures) and all(runs > 0 for runs in figures.values())
    line = json.dumps(
        {
            "partitions": 8,
            "members": 2,
            "rates": [
                {"target_events_per_s": 1000, "runs_per_minute": 4.5},
                {"target_events_per_s": 20000, "runs_per_minute": 30.0},
            ],
        }
    )
    assert runs_per_minute_from_json(f"some progress\n{line}\n") == (8, 2, {1_000.0: 4.5, 20_000.0: 30.0})


def test_the_cli_names_its_inputs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("measured inputs: ") and "docs/benchmarks.md" in out
    assert "| 20,000 | `max_wait_s=60`, `min_backlog=200,000` | 6.00 (modelled) |" in out
