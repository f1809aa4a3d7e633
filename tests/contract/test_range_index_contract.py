"""The committed-range index (stores/ranges.py), written once and run against every store: what a backfill finds of
a shard's committed ranges over a span, whatever the history around it."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from dagster_streamgroup.stores.base import state_key
from dagster_streamgroup.stores.ranges import RangeIndex, range_index
from tests.contract.store_harness import BUILDERS, PARAMS, StoreHarness


@pytest.fixture(params=PARAMS)
def index(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RangeIndex]:
    harness: StoreHarness = BUILDERS[request.param](request, tmp_path)
    try:
        yield range_index(harness.store)
    finally:
        harness.store.close()
        if harness.cleanup is not None:
            harness.cleanup()


@pytest.fixture
def key() -> str:
    return state_key(f"stream-{uuid.uuid4().hex[:8]}", "group")


def tiling(shard: str, bounds: list[int]) -> list[tuple[str, int, int]]:
    return [(shard, a, b) for a, b in itertools.pairwise(bounds)]


def test_the_ranges_over_a_span_include_those_it_cuts(index: RangeIndex, key: str) -> None:
    index.record_ranges(key, tiling("t:0", [0, 10, 25, 40, 41, 60]))
    index.record_ranges(key, tiling("t:1", [0, 100]))
    assert index.ranges_between(key, "t:0", 12, 41) == [(10, 25), (25, 40), (40, 41)]
    assert index.ranges_between(key, "t:0", 0, 10) == [(0, 10)]
    assert index.ranges_between(key, "t:0", 59, 100) == [(41, 60)]
    assert index.ranges_between(key, "t:0", 60, 100) == []
    assert index.ranges_between(key, "t:1", 5, 6) == [(0, 100)]
    assert index.ranges_between(key, "t:2", 0, 100) == []
    other = state_key("another-stream", "group")
    assert index.ranges_between(other, "t:0", 0, 100) == [], "each group's own"


def test_recording_again_changes_nothing_and_a_range_replaces_those_it_overlaps(index: RangeIndex, key: str) -> None:
    index.record_ranges(key, tiling("t:0", [0, 10, 20, 30]))
    index.record_ranges(key, [("t:0", 10, 20)])
    assert index.ranges_between(key, "t:0", 0, 30) == [(0, 10), (10, 20), (20, 30)]
    index.record_ranges(key, [("t:0", 15, 25)])  # committed again after the offsets were moved back to 15
    assert index.ranges_between(key, "t:0", 0, 30) == [(0, 10), (15, 25)]


def test_ranges_below_a_floor_are_dropped(index: RangeIndex, key: str) -> None:
    index.record_ranges(key, tiling("t:0", [0, 10, 20, 30]) + tiling("t:1", [0, 50]))
    index.record_ranges(key, [("t:0", 30, 40)], floors={"t:0": 20, "t:1": 10})
    assert index.ranges_between(key, "t:0", 0, 100) == [(20, 30), (30, 40)]
    assert index.ranges_between(key, "t:1", 0, 100) == [(0, 50)], "a range that ends past its floor is kept"


def test_a_long_history_answers_for_a_span_in_the_middle(index: RangeIndex, key: str) -> None:
    bounds = [0]
    for i in range(3000):
        bounds.append(bounds[-1] + 1 + i % 7)
    index.record_ranges(key, tiling("t:0", bounds))
    found = index.ranges_between(key, "t:0", bounds[1500] + 1, bounds[1510])
    assert found == [(bounds[i], bounds[i + 1]) for i in range(1500, 1510)]


def test_a_range_recorded_out_of_order_replaces_only_what_it_overlaps(index: RangeIndex, key: str) -> None:
    """A repair recorded beside a later run's ranges, a page of history with one out of place."""
    index.record_ranges(key, tiling("t:0", [0, 10, 20, 30]))
    index.record_ranges(key, [("t:0", 30, 40), ("t:0", 40, 50), ("t:0", 0, 10)])
    assert index.ranges_between(key, "t:0", 0, 100) == [(0, 10), (10, 20), (20, 30), (30, 40), (40, 50)]
