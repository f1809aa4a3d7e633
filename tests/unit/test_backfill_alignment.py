"""A backfill re-processes the ranges the group committed with their exact bounds, so output keyed by range is
replaced rather than written again under another key; offsets no committed range covers are cut in chunks."""

from __future__ import annotations

import pytest

from dagster_streamgroup.dagster.operator import OperatorError, aligned_ranges, chunk_ranges

COMMITTED = [(0, 120), (120, 300), (300, 310), (500, 700)]


def test_a_backfill_follows_the_committed_ranges() -> None:
    assert aligned_ranges(0, 310, COMMITTED, 100) == [(0, 120), (120, 300), (300, 310)]
    assert chunk_ranges(0, 310, 100) == [(0, 100), (100, 200), (200, 300), (300, 310)], "what it was before"


def test_a_range_cut_by_from_or_to_is_taken_whole() -> None:
    assert aligned_ranges(150, 305, COMMITTED, 100) == [(120, 300), (300, 310)]


def test_offsets_no_committed_range_covers_are_chunked() -> None:
    # 310-500: committed by no run whose materialization exists (say, before a skip); 700-760 past them all
    assert aligned_ranges(300, 760, COMMITTED, 100) == [
        (300, 310), (310, 410), (410, 500), (500, 700), (700, 760),
    ]  # fmt: skip
    assert aligned_ranges(1000, 1100, COMMITTED, 60) == [(1000, 1060), (1060, 1100)]


def test_repeated_materializations_of_a_range_count_once() -> None:
    """A range retried after a refused commit, or repaired, shows more than one materialization."""
    assert aligned_ranges(0, 120, [(0, 120), (0, 120)], 50) == [(0, 120)]


@pytest.mark.parametrize(("start", "end", "chunk", "words"), [(5, 5, 10, "from < to"), (0, 10, 0, "--chunk")])
def test_bad_bounds_name_the_option(start: int, end: int, chunk: int, words: str) -> None:
    with pytest.raises(OperatorError, match=words):
        aligned_ranges(start, end, COMMITTED, chunk)
