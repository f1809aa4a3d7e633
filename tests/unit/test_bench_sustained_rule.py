"""When ``bench.sustained`` calls a rate sustained (``judge_sustained``), against the rule before.

The rule before accepted lag tops rising at up to 10% of the rate, estimated from two points, and asked
nothing else. Each test below builds the samples of a phase the old rule accepts and shows one of the three
new conditions failing it on its own: tops fitted over all of them rising faster than 2% of the rate, the
group not catching up within the settle time, and seconds behind rising from the third to the fourth quarter.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.figures import peak_growth
from bench.peer_follow import checkpoint_committed
from bench.sustained import (
    comparison,
    fitted_peak_growth,
    judge_sustained,
    ladder_stop,
    lag_peaks,
    old_rule_sustained,
    quarter_means,
    run_cycle,
)

RATE = 50_000.0
START, END = 0.0, 240.0  # a 4-minute phase
PERIOD = 20.0  # the deployment commits every 20 s
TIMES = [float(t) for t in range(0, 241, 2)]  # a sample every 2 s


def sawtooth(t: float, trend: float = 0.0) -> float:
    """Records behind a deployment that commits everything every ``PERIOD`` s, plus ``trend`` records/s."""
    return RATE * ((t + 1.0) % PERIOD) + trend * t


def level_lag(trend: float = 0.0) -> list[tuple[float, float]]:
    return [(t, sawtooth(t, trend)) for t in TIMES]


def level_ages() -> list[tuple[float, float]]:
    """Seconds behind the oldest uncommitted record: the same sawtooth, in seconds, 5 s above it."""
    return [(t, 5.0 + (t + 1.0) % PERIOD) for t in TIMES]


def test_a_level_sawtooth_that_catches_up_is_sustained() -> None:
    verdict = judge_sustained(level_lag(), level_ages(), START, END, RATE, caught_up=True)
    assert verdict.sustained and verdict.failed == ()
    assert verdict.peak_growth_records_per_s == pytest.approx(0.0, abs=1.0)
    assert verdict.peaks == 6  # one top per commit over the second half's 120 s
    assert verdict.behind_q3_s == pytest.approx(verdict.behind_q4_s, abs=0.5)
    assert old_rule_sustained(level_lag(), START, END, RATE)


def test_tops_rising_at_4_percent_of_the_rate_pass_the_old_rule_and_fail_the_new() -> None:
    growing = level_lag(trend=0.04 * RATE)  # falls behind by 2,000 records/s
    assert old_rule_sustained(growing, START, END, RATE)  # 2,000 <= 10% of 50,000
    verdict = judge_sustained(growing, level_ages(), START, END, RATE, caught_up=True)
    assert verdict.failed == ("lag_peaks_growing",)
    assert verdict.peak_growth_records_per_s == pytest.approx(2_000.0, rel=0.01)
    assert verdict.growth_limit_records_per_s == pytest.approx(1_000.0)


def test_two_tops_hide_a_trend_that_the_fit_over_all_tops_sees() -> None:
    """One high tooth at the end of the third quarter (a slow run): the line through the highest top of each
    quarter falls, so two points would pass even the new 2% limit; the fit through all six tops still
    rises faster than that."""
    points = level_lag(trend=0.04 * RATE)
    spike = TIMES.index(178.0)
    points[spike] = (points[spike][0], points[spike][1] + 300_000.0)
    assert old_rule_sustained(points, START, END, RATE)
    two_point = peak_growth(points, START, END)
    assert two_point is not None and two_point < 0.0
    growth, peaks = fitted_peak_growth(points, START, END)
    assert peaks == 6
    assert growth is not None and growth > 0.02 * RATE
    verdict = judge_sustained(points, level_ages(), START, END, RATE, caught_up=True)
    assert verdict.failed == ("lag_peaks_growing",)


def test_a_level_lag_that_did_not_catch_up_passes_the_old_rule_and_fails_the_new() -> None:
    assert old_rule_sustained(level_lag(), START, END, RATE)
    verdict = judge_sustained(level_lag(), level_ages(), START, END, RATE, caught_up=False)
    assert verdict.failed == ("not_caught_up",)


def test_seconds_behind_rising_in_the_last_quarter_passes_the_old_rule_and_fails_the_new() -> None:
    """The lag in records stays level, but one shard stopped being read from 180 s on: its oldest record
    ages one second per second while the others carry the lag's sawtooth."""
    ages = [(t, age if t < 180 else max(age, t - 180 + 15.0)) for t, age in level_ages()]
    assert old_rule_sustained(level_lag(), START, END, RATE)
    verdict = judge_sustained(level_lag(), ages, START, END, RATE, caught_up=True)
    assert verdict.failed == ("seconds_behind_rising",)
    assert verdict.behind_q3_s is not None and verdict.behind_q4_s is not None
    assert verdict.behind_rise_limit_s is not None
    assert verdict.behind_q4_s - verdict.behind_q3_s > verdict.behind_rise_limit_s


def test_the_seconds_behind_rule_tolerates_a_share_of_the_level_with_a_floor() -> None:
    q3_then_q4 = [(t, 20.0 if t < 180 else 23.0) for t in TIMES]  # +3 s on a 20 s level: within 20% of it
    assert judge_sustained(level_lag(), q3_then_q4, START, END, RATE, caught_up=True).sustained
    q3_then_q4 = [(t, 20.0 if t < 180 else 25.0) for t in TIMES]  # +5 s: above 4 s
    assert judge_sustained(level_lag(), q3_then_q4, START, END, RATE, caught_up=True).failed == (
        "seconds_behind_rising",
    )
    near_zero = [(t, 0.2 if t < 180 else 1.5) for t in TIMES]  # under the floor of one 2 s sample interval
    assert judge_sustained(level_lag(), near_zero, START, END, RATE, caught_up=True, behind_floor_s=2.0).sustained


def test_every_condition_fails_at_once_and_too_few_samples_fail() -> None:
    growing = level_lag(trend=0.5 * RATE)
    ages = [(t, t) for t in TIMES]
    verdict = judge_sustained(growing, ages, START, END, RATE, caught_up=False)
    assert verdict.failed == ("lag_peaks_growing", "not_caught_up", "seconds_behind_rising")
    empty = judge_sustained([], [], START, END, RATE, caught_up=True)
    assert empty.failed == ("lag_peaks_growing", "seconds_behind_rising")


def test_tops_of_a_sawtooth_committed_in_parts() -> None:
    # Two members commit one after the other: 0 -> 10 -> 6 (first commit) -> 3 (second) -> 8 -> 2 -> 5.
    points = [(0.0, 0.0), (1.0, 10.0), (2.0, 6.0), (3.0, 3.0), (4.0, 8.0), (5.0, 2.0), (6.0, 5.0)]
    assert lag_peaks(points) == [(1.0, 10.0), (4.0, 8.0)]  # 6 is a step down, 5 below the last top
    rising = [(0.0, 0.0), (1.0, 10.0), (2.0, 4.0), (3.0, 12.0)]
    assert lag_peaks(rising) == [(1.0, 10.0), (3.0, 12.0)]  # the tooth in progress is above every top


def test_a_lag_without_commits_grows_at_its_slope_and_a_flat_lag_not_at_all() -> None:
    growth, peaks = fitted_peak_growth([(t, 1_000.0 * t) for t in TIMES], START, END)
    assert growth == pytest.approx(1_000.0)
    assert peaks == 1  # only the last sample is a top
    growth, peaks = fitted_peak_growth([(t, 0.0) for t in TIMES], START, END)
    assert growth == pytest.approx(0.0)
    assert peaks == 1


def test_quarter_means() -> None:
    q3, q4 = quarter_means([(t, 1.0 if t < 180 else 3.0) for t in TIMES], START, END)
    assert q3 == pytest.approx(1.0)
    assert q4 == pytest.approx(3.0)
    assert quarter_means([(10.0, 5.0)], START, END) == (None, None)


def test_seconds_behind_over_the_p95_limit_fails_a_rate_that_keeps_pace() -> None:
    """The peer comparison's rule: a rate is sustained only with p95 seconds behind under the limit (30 s),
    however level the lag."""
    far_behind = [(t, 35.0 + (t + 1.0) % PERIOD) for t in TIMES]
    kept_pace = judge_sustained(level_lag(), far_behind, START, END, RATE, caught_up=True)
    assert kept_pace.sustained, "without the limit, a level lag far behind is sustained"
    limited = judge_sustained(level_lag(), far_behind, START, END, RATE, caught_up=True, max_p95_behind_s=30.0)
    assert limited.failed == ("seconds_behind_p95_over_limit",)
    assert judge_sustained(level_lag(), level_ages(), START, END, RATE, caught_up=True, max_p95_behind_s=30.0).sustained


def test_the_ladder_stops_where_the_producer_or_the_side_cannot_go_on() -> None:
    def figures(target: float, achieved: float, caught_up: bool) -> dict[str, object]:
        return {"target_events_per_s": target, "achieved_events_per_s": achieved, "caught_up": caught_up}

    assert ladder_stop(figures(50_000, 49_600, True)) is None
    assert ladder_stop(figures(150_000, 120_000, True)) == "the producer reached 120000 of 150000 events/s"
    assert ladder_stop(figures(75_000, 75_000, False)) == "not caught up within the settle time after 75000 events/s"


def test_the_comparison_with_the_peer() -> None:
    ours = {"max_sustained_events_per_s": 75_000.0, "p95_seconds_behind_at_50000": 23.5, "cores_at_1000": 0.5}
    peer = {"max_sustained_events_per_s": 100_000.0, "p95_seconds_behind_at_50000": 9.0, "cores_at_1000": 1.0}
    assert comparison(ours, peer) == {
        "max_sustained_ours_minus_peer": -25_000.0,
        "p95_at_50000_ours_minus_peer_s": 14.5,
        "cores_at_1000_ratio": 0.5,
    }
    nothing = {"max_sustained_events_per_s": None, "p95_seconds_behind_at_50000": None, "cores_at_1000": None}
    assert comparison(nothing, peer)["max_sustained_ours_minus_peer"] == -100_000.0
    assert comparison(ours, nothing) == {
        "max_sustained_ours_minus_peer": None,
        "p95_at_50000_ours_minus_peer_s": None,
        "cores_at_1000_ratio": None,
    }


def test_the_peer_checkpoint_is_read_like_a_group_offset(tmp_path: Path) -> None:
    """The layout Spark's offset and commit logs have (``tests/peer`` reads a real one): the end offsets of
    the last committed batch; a batch planned but not committed does not count; nothing before the first."""
    checkpoint = tmp_path / "checkpoint"
    shards = ["t:0", "t:1"]
    assert checkpoint_committed(checkpoint, "t", shards) == {"t:0": None, "t:1": None}
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "commits").mkdir()
    for batch_id, ends in ((0, {"0": 10, "1": 4}), (1, {"0": 25, "1": 9}), (2, {"0": 40, "1": 12})):
        (checkpoint / "offsets" / str(batch_id)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{json.dumps({"t": ends})}')
    for batch_id in (0, 1):
        (checkpoint / "commits" / str(batch_id)).write_text('v1\n{"nextBatchWatermarkMs":0}')
    (checkpoint / "commits" / ".2.crc").write_text("")
    assert checkpoint_committed(checkpoint, "t", shards) == {"t:0": 25, "t:1": 9}
    (checkpoint / "offsets" / "1").write_text("not an offset log")
    with pytest.raises(ValueError, match="offset log"):
        checkpoint_committed(checkpoint, "t", shards)


def test_the_run_cycle_splits_each_members_runs_into_queue_run_and_gap() -> None:
    def run(member: str, created: float, started: float, ended: float) -> dict[str, object]:
        return {
            "creationTime": created,
            "startTime": started,
            "endTime": ended,
            "tags": {"streamgroup/member": member},
        }

    runs = [
        run("a", 10.0, 11.0, 15.0),
        run("b", 10.5, 11.0, 13.0),
        run("a", 17.0, 17.5, 21.5),  # 2 s after a's first ended
        run("b", 16.0, 16.5, 18.5),  # 3 s after b's first ended
        {"creationTime": 12.0, "startTime": None, "endTime": None, "tags": {"streamgroup/member": "a"}},  # not ended
        {"creationTime": 12.0, "startTime": 12.5, "endTime": 13.0, "tags": {}},  # a backfill: no member
    ]

    cycle = run_cycle(runs, "streamgroup/member")

    assert cycle["runs"] == 4
    assert cycle["queued_s"]["p50"] == 0.5
    assert cycle["running_s"]["p50"] == 3.0
    assert cycle["gap_s"]["p50"] == 2.5
    assert cycle["cycle_s"]["p50"] == 6.25
