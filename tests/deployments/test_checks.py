"""The cross-instance check of the two-deployment test fails on what it is there to catch."""

from __future__ import annotations

import pytest

from tests.deployments.harness import Committed, assert_tiled_once, committed_ranges

LOWS = {"t:0": 0, "t:1": 10}
HIGHS = {"t:0": 300, "t:1": 60}


def r(deployment: str, shard: str, start: int, end: int) -> Committed:
    return Committed(deployment, shard, start, end, member=f"m@{deployment}", run_id=f"{deployment}-{shard}-{start}")


def test_ranges_of_two_instances_tile_every_shard() -> None:
    assert_tiled_once(
        [r("a", "t:0", 0, 100), r("b", "t:0", 100, 300), r("b", "t:1", 10, 40), r("a", "t:1", 40, 60)], LOWS, HIGHS
    )


@pytest.mark.parametrize(
    ("ranges", "message"),
    [
        # the same range recorded by both instances: committed twice
        ([r("a", "t:0", 0, 300), r("b", "t:0", 0, 300), r("a", "t:1", 10, 60)], "committed twice"),
        # an overlap inside one instance
        ([r("a", "t:0", 0, 200), r("a", "t:0", 150, 300), r("a", "t:1", 10, 60)], "committed twice"),
        ([r("a", "t:0", 0, 100), r("b", "t:0", 120, 300), r("a", "t:1", 10, 60)], "a gap"),
        ([r("a", "t:0", 0, 300), r("a", "t:1", 10, 50)], "high watermark 60"),
        ([r("a", "t:0", 0, 300)], "shards materialized"),
    ],
)
def test_a_double_commit_or_a_gap_fails(ranges: list[Committed], message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        assert_tiled_once(ranges, LOWS, HIGHS)


def test_backfills_are_not_commits_and_a_commit_must_end_its_range() -> None:
    common = {"shard": "t:0", "member": "m@a", "runId": "r1"}
    materializations = [
        {**common, "start": 0, "end": 5, "committed": 5},
        {"shard": "t:0", "start": 0, "end": 5, "runId": "r2", "backfill": True},
    ]
    assert committed_ranges("a", materializations) == [Committed("a", "t:0", 0, 5, "m@a", "r1")]
    with pytest.raises(AssertionError, match="does not commit its own end"):
        committed_ranges("a", [{**common, "start": 0, "end": 5, "committed": 4}])
