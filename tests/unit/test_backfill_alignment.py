"""A backfill re-processes the ranges the group committed with their exact bounds, so output keyed by range is
replaced rather than written again under another key; offsets no committed range covers are cut in pieces; it never
reaches past the group's committed offset (unless the sink replaces rows by their coordinates); and consecutive
ranges are read together, in waves of at most a run's budget."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dagster_streamgroup.protocol.backfill import BackfillPlan, BackfillRefusedError, plan_backfill

COMMITTED = [(0, 120), (120, 300), (300, 310), (500, 700)]


def plan(
    start: int,
    end: int,
    *,
    committed: int | None = 700,
    low: int = 0,
    budget: int = 1000,
    chunk: int = 100,
    align: bool = True,
    ahead: bool = False,
) -> BackfillPlan:
    return plan_backfill(
        "t:0", start, end, committed=committed, low=low, high=800, recorded=COMMITTED, budget=budget, chunk=chunk,
        align=align, ahead=ahead,
    )  # fmt: skip


def test_a_backfill_follows_the_committed_ranges() -> None:
    result = plan(0, 310)
    assert result.ranges == [(0, 120), (120, 300), (300, 310)] and result.notes() == []
    assert [(w.start, w.end) for w in result.waves] == [(0, 310)], "read together: one wave"
    unaligned = plan(0, 310, align=False)
    assert unaligned.ranges == [(0, 100), (100, 200), (200, 300), (300, 310)], "what it was before alignment"


def test_a_range_cut_by_from_or_to_is_taken_whole() -> None:
    result = plan(150, 305)
    assert result.ranges == [(120, 300), (300, 310)] and (result.start, result.end) == (120, 310)
    assert result.widened and "whole ranges" in result.notes()[0]


def test_offsets_no_committed_range_covers_are_cut_in_pieces() -> None:
    # 310-500: committed by no range the index holds (dead-lettered, say)
    result = plan(300, 700)
    assert result.ranges == [(300, 310), (310, 410), (410, 500), (500, 700)]
    assert result.gaps == ((310, 500),) and "no committed range is recorded over [310, 500)" in result.notes()[0]


def test_a_backfill_never_reaches_past_the_committed_offset() -> None:
    result = plan(200, 800, committed=310)
    assert result.ranges == [(120, 300), (300, 310)] and result.clipped_at == 310
    assert "past the group's committed offset 310" in result.notes()[0]
    with pytest.raises(BackfillRefusedError, match="not committed yet"):
        plan(310, 400, committed=310)
    with pytest.raises(BackfillRefusedError, match="committed nothing"):
        plan(0, 10, committed=None)


def test_a_sink_that_replaces_by_coordinates_may_reach_past_it() -> None:
    result = plan(250, 800, committed=310, align=False, ahead=True, chunk=1000)
    assert result.ranges == [(250, 800)] and result.clipped_at is None


def test_retention_is_checked_on_the_bounds_that_run() -> None:
    with pytest.raises(BackfillRefusedError, match=r"offset 120 of t:0 \(where the committed range \[120, 300\)"):
        plan(150, 305, low=130)  # --from 150 is retained, the whole range it cuts is not
    assert plan(300, 305, low=130).start == 300


def test_waves_hold_at_most_the_budget_and_a_longer_range_is_a_wave_of_its_own() -> None:
    result = plan(0, 700, budget=150)
    assert [w.ranges for w in result.waves] == [
        ((0, 120),), ((120, 300),), ((300, 310), (310, 410)), ((410, 500),), ((500, 700),),
    ]  # fmt: skip


def test_ranges_recorded_before_offsets_moved_back_are_left_out() -> None:
    result = plan_backfill(
        "t:0", 0, 100, committed=100, low=0, high=800, recorded=[(0, 50), (50, 150), (40, 90)], budget=1000, chunk=30
    )
    assert result.ranges == [(0, 50), (50, 80), (80, 100)] and set(result.skipped) == {(50, 150), (40, 90)}


@pytest.mark.parametrize(("start", "end", "words"), [(5, 5, "from < to"), (0, 900, "past the end of t:0")])
def test_bad_bounds_are_refused(start: int, end: int, words: str) -> None:
    with pytest.raises(BackfillRefusedError, match=words):
        plan(start, end)


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[tuple[int, int]], int, int, int, int]:
    """Committed ranges tiling [first, committed) with some left unrecorded, and a request."""
    first = draw(st.integers(0, 50))
    sizes = draw(st.lists(st.integers(1, 60), min_size=1, max_size=40))
    bounds = [first]
    for size in sizes:
        bounds.append(bounds[-1] + size)
    ranges = list(itertools.pairwise(bounds))
    kept = [r for r in ranges if draw(st.booleans()) or draw(st.booleans())]
    committed = bounds[-1]
    start = draw(st.integers(first, committed - 1))
    end = draw(st.integers(start + 1, committed + 100))
    return kept, committed, start, end, first


@settings(max_examples=300, deadline=None)
@given(history=histories(), budget=st.integers(1, 200), chunk=st.integers(1, 80))
def test_an_aligned_plan_replaces_whole_recorded_ranges_and_stays_behind_the_group(
    history: tuple[list[tuple[int, int]], int, int, int, int], budget: int, chunk: int
) -> None:
    recorded, committed, start, end, first = history
    result = plan_backfill(
        "t:0", start, end, committed=committed, low=first, high=committed + 100, recorded=recorded, budget=budget,
        chunk=chunk,
    )  # fmt: skip
    pieces = result.ranges
    assert all(a < b for a, b in pieces) and all(p[1] == q[0] for p, q in itertools.pairwise(pieces))
    assert result.start <= start and min(end, committed) <= result.end <= committed, "covers the request, not past"
    for lo, hi in recorded:
        if hi > result.start and lo < result.end:
            assert (lo, hi) in pieces, f"recorded range [{lo}, {hi}) re-processed whole"
    for lo, hi in pieces:
        assert not any(a < lo < b or a < hi < b for a, b in recorded), "no piece cuts a recorded range"
    for wave in result.waves:
        assert wave.records <= budget or len(wave.ranges) == 1, "a wave holds at most the budget"
        assert (wave.start, wave.end) == (wave.ranges[0][0], wave.ranges[-1][1])
