"""The counting behind bench.recovery: duplicated, lost and reprocessed records, the kill point."""

from __future__ import annotations

import pytest

from bench.chaos.check import merge
from bench.recovery import (
    Files,
    Range,
    duplicated_records,
    intersection_length,
    kill_fraction,
    length,
    lost_records,
    reprocessed_records,
    rewritten,
    uncommitted,
    windows_of,
)

WINDOWS = {"t:0": (100, 200), "t:1": (0, 50)}


def test_merged_joins_touching_and_overlapping_intervals() -> None:
    assert merge([(5, 10), (0, 5), (8, 12), (20, 20), (30, 40)]) == [(0, 12), (30, 40)]
    assert length([(0, 10), (5, 15)]) == 15
    assert intersection_length([(0, 10), (20, 30)], [(5, 25)]) == 10
    assert intersection_length([], [(0, 1)]) == 0


def test_duplicated_counts_the_overlap_within_the_window_only() -> None:
    ranges: list[Range] = [("t:0", 100, 150), ("t:0", 150, 200), ("t:1", 0, 50)]
    assert duplicated_records(ranges, WINDOWS) == 0
    # a rerun over [120, 170) after [100, 150) and [150, 200) were written: 50 records held twice
    assert duplicated_records([*ranges, ("t:0", 120, 170)], WINDOWS) == 50
    # three copies of [0, 10) count twice; a warm-up range below the window and other shards do not count
    extra: list[Range] = [("t:1", 0, 10), ("t:1", 0, 10), ("t:0", 0, 100), ("t:0", 50, 100), ("u:0", 0, 50)]
    assert duplicated_records([*ranges, *extra], WINDOWS) == 20


def test_lost_counts_the_window_no_range_holds() -> None:
    assert lost_records([("t:0", 100, 200), ("t:1", 0, 50)], WINDOWS) == 0
    assert lost_records([("t:0", 100, 150), ("t:0", 160, 300)], WINDOWS) == 10 + 50
    assert lost_records([], WINDOWS) == 150


def test_kill_fraction_clamps_each_shard_to_its_window() -> None:
    assert kill_fraction(WINDOWS, {}) == 0.0
    assert kill_fraction(WINDOWS, {"t:0": 160, "t:1": None}) == pytest.approx(60 / 150)
    assert kill_fraction(WINDOWS, {"t:0": 50, "t:1": 500}) == pytest.approx(50 / 150)
    assert kill_fraction(WINDOWS, {"t:0": 200, "t:1": 50}) == 1.0
    assert kill_fraction({}, {}) == 1.0
    assert windows_of({"t:0": 100}, {"t:1": 50, "t:0": 200}) == WINDOWS


def test_uncommitted_are_the_ranges_at_or_beyond_the_committed_offsets() -> None:
    ranges: list[Range] = [("t:0", 100, 150), ("t:0", 150, 180), ("t:1", 0, 20), ("t:0", 0, 100), ("u:0", 9, 10)]
    assert uncommitted(ranges, {"t:0": 150, "t:1": 20}, WINDOWS) == [("t:0", 150, 180)]
    # no offset yet: everything from the window's start on (the warm-up range below it was committed)
    assert uncommitted(ranges, {"t:0": None}, WINDOWS) == [("t:0", 100, 150), ("t:0", 150, 180), ("t:1", 0, 20)]
    assert uncommitted(ranges, {"t:0": 200, "t:1": 50}, WINDOWS) == []


def files(*names: str) -> Files:
    return frozenset((name, 1) for name in names)


def test_reprocessed_counts_ranges_written_before_the_kill_and_again_after() -> None:
    before: dict[Range, Files] = {
        ("t:0", 100, 150): files("a.parquet"),
        ("t:0", 150, 180): files("b.parquet"),
        ("t:1", 0, 20): files("c.parquet"),
    }
    after: dict[Range, Files] = {
        ("t:0", 100, 150): files("a.parquet"),  # untouched
        ("t:0", 150, 180): files("b2.parquet"),  # the same range written again: 30
        ("t:0", 180, 200): files("d.parquet"),  # new, over nothing written before: 0
        ("t:1", 0, 20): files("c.parquet"),
        ("t:1", 10, 50): files("e.parquet"),  # new, over [10, 20) written before: 10
    }
    assert rewritten(before, after) == [("t:0", 150, 180), ("t:0", 180, 200), ("t:1", 10, 50)]
    assert reprocessed_records(before, after, WINDOWS) == 40
    assert reprocessed_records(after, after, WINDOWS) == 0
    assert reprocessed_records({}, after, WINDOWS) == 0
