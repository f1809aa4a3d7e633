"""Planning a read's Spark tasks from its ranges (``dagster_streamgroup.spark.ranges``), pure."""

from __future__ import annotations

import pytest

from dagster_streamgroup.spark.ranges import ShardRange, pack_partitions, plan_partitions


def r(shard: str, start: int, end: int) -> ShardRange:
    return ShardRange(shard, start, end)


def test_large_ranges_are_split_and_the_small_ones_kept_whole() -> None:
    planned = plan_partitions([r("t:0", 0, 1000), r("t:1", 0, 10), r("t:2", 5, 5)], max_records_per_partition=400)
    assert planned == [r("t:0", 0, 334), r("t:0", 334, 667), r("t:0", 667, 1000), r("t:1", 0, 10)]


def test_small_ranges_share_a_task_until_it_holds_enough_and_large_ones_keep_theirs() -> None:
    """A quiet stream's run: many ranges of a few hundred records. They are read a few tasks' worth at a time,
    in order; a range at or above the size keeps a task of its own."""
    pieces = [r("t:0", 0, 300), r("t:1", 0, 300), r("t:2", 0, 5000), r("t:3", 0, 300), r("t:4", 0, 200)]
    assert pack_partitions(pieces, 500) == [
        (r("t:0", 0, 300), r("t:1", 0, 300)),
        (r("t:2", 0, 5000),),
        (r("t:3", 0, 300), r("t:4", 0, 200)),
    ]
    quiet = [r(f"t:{p}", 0, 770) for p in range(11)]  # 1,000 events/s over 32 partitions, 3 members
    assert pack_partitions(quiet, 10_000) == [tuple(quiet)]
    packed = pack_partitions(quiet, 1_000)
    assert [len(task) for task in packed] == [2, 2, 2, 2, 2, 1]
    assert [piece for task in packed for piece in task] == quiet, "every range once, in order"


def test_without_a_size_every_piece_is_a_task_and_a_bad_size_is_named() -> None:
    pieces = [r("t:0", 0, 3), r("t:1", 0, 4)]
    assert pack_partitions(pieces, None) == [(pieces[0],), (pieces[1],)]
    assert pack_partitions([], 100) == []
    with pytest.raises(ValueError, match="minRecordsPerPartition must be >= 1, got 0"):
        pack_partitions(pieces, 0)
