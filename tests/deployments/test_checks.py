"""The checks of the two-deployment, end-to-end and smoke tests fail on what they are there to catch: a double
commit or a gap across instances, a commit that counted fewer records than its range, an output folder that
does not hold its range's records, a time past its bound plus the margin."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dagster_streamgroup.streams.base import Watermarks
from jobs.clickstream import range_directory
from tests.deployments.harness import Committed, assert_tiled_once, committed_ranges
from tests.e2e.scenario import assert_exactly_once, assert_output_counts, output_views, timing_limit_s

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
        # the same range recorded by both instances: committed twice, and both are named
        (
            [r("a", "t:0", 0, 300), r("b", "t:0", 0, 300), r("a", "t:1", 10, 60)],
            r"\[0, 300\) in b, run b-t:0-0 follows offset 300 \(committed twice: \[0, 300\) in a, run a-t:0-0\)",
        ),
        # a run's own materialization and a member's repair of the same range
        (
            [r("a", "t:0", 0, 300), Committed("a", "t:0", 0, 300, "m@a", ""), r("a", "t:1", 10, 60)],
            r"committed twice: \[0, 300\) in a, (run a-t:0-0|a repair \(no run\))",
        ),
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


def test_a_commit_must_end_its_range() -> None:
    common = {"shard": "t:0", "member": "m@a", "runId": "r1"}
    materializations = [{**common, "start": 0, "end": 5, "committed": 5, "records": 5}]
    assert committed_ranges("a", materializations) == [Committed("a", "t:0", 0, 5, "m@a", "r1")]
    with pytest.raises(AssertionError, match="does not commit its own end"):
        committed_ranges("a", [{**common, "start": 0, "end": 5, "committed": 4, "records": 5}])


def test_a_commit_that_read_fewer_records_than_its_range_fails() -> None:
    """A read that silently dropped records and still committed: its range tiles, its count does not."""
    common = {"shard": "t:0", "member": "m@a", "runId": "r1", "start": 0, "end": 5, "committed": 5}
    with pytest.raises(AssertionError, match="counts 4 records"):
        committed_ranges("a", [{**common, "records": 4}])
    with pytest.raises(AssertionError, match="counts None records"):
        committed_ranges("a", [common])
    # A member's record of a run killed after its commit carries no count: its output is what is checked.
    assert committed_ranges("a", [{**common, "repaired": True}]) == [Committed("a", "t:0", 0, 5, "m@a", "r1")]
    marks = {"t:0": Watermarks(0, 5)}
    assert_exactly_once([{**common, "records": 5}], marks)
    with pytest.raises(AssertionError, match=r"t:0 \[0, 5\) of run r1: 4 records read"):
        assert_exactly_once([{**common, "records": 4}], marks)


def write_range(output: Path, shard: str, start: int, end: int, views: list[int]) -> None:
    """An output folder as the example writes it: ``range=<shard>-<start>-<end>`` with a ``views`` column."""
    folder = output / f"range={range_directory(shard, start, end)}"
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"page": [f"p{i}" for i in range(len(views))], "views": views}), folder / "part-0.parquet")


def test_each_range_folder_of_the_output_must_hold_its_records(tmp_path: Path) -> None:
    write_range(tmp_path, "t:0", 0, 10, [4, 6])
    write_range(tmp_path, "t:0", 10, 20, [3, 6])  # one record of [10, 20) dropped
    ranges: list[dict[str, Any]] = [{"shard": "t:0", "start": 0, "end": 10}]
    assert output_views(tmp_path, "t:0", 0, 10) == 10
    assert_output_counts(tmp_path, ranges)
    with pytest.raises(AssertionError, match=r"t:0 \[10, 20\): 9 views"):
        assert_output_counts(tmp_path, [*ranges, {"shard": "t:0", "start": 10, "end": 20}])
    with pytest.raises(AssertionError, match=r"t:1 \[0, 10\): None views"):  # no folder at all
        assert_output_counts(tmp_path, [{"shard": "t:1", "start": 0, "end": 10}])


def test_a_timing_bound_gets_a_margin_of_three_ticks() -> None:
    assert timing_limit_s(30.0, 5.0) == 45.0 and timing_limit_s(5.0, 5.0) == 20.0
