"""The sinks' pure parts: which rows a run's ranges hold (the predicate a Delta commit replaces by, and the same
test on Arrow rows), the source kind a run's shards name, and the settings each sink refuses when it is built."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dagster_streamgroup.sinks import CoordinateColumns, DeltaSink, RangeFolderSink, SinkResult
from dagster_streamgroup.sinks.coordinates import check_ranges, range_predicate, rows_in_ranges, source_kind


@dataclass(frozen=True)
class R:
    shard: str
    start: int
    end: int


def test_the_predicate_quotes_names_and_topic_values() -> None:
    predicate = range_predicate([R("it's:2", 5, 9), R("clicks:0", 0, 0)], "kafka", CoordinateColumns())
    assert predicate == """("topic" = 'it''s' AND "partition" = 2 AND "offset" >= 5 AND "offset" < 9)"""
    assert range_predicate([R("clicks:0", 3, 3)], "kafka", CoordinateColumns()) == "false", "an empty range: no row"


def test_the_source_kind_is_one_per_run() -> None:
    assert source_kind([R("clicks:0", 0, 1), R("views:3", 0, 1)]) == "kafka"
    assert source_kind([R("0", 0, 1), R("12", 0, 1)]) == "v3io"
    with pytest.raises(ValueError, match="the shards of one stream"):
        source_kind([R("clicks:0", 0, 1), R("3", 0, 1)])
    with pytest.raises(ValueError, match="neither"):
        source_kind([R("clicks", 0, 1)])
    with pytest.raises(ValueError, match="appears twice"):
        check_ranges([R("c:0", 0, 1), R("c:0", 1, 2)])
    with pytest.raises(ValueError, match="not an offset range"):
        check_ranges([R("c:0", 5, 2)])


@settings(deadline=None)  # the first call imports pyarrow's compute kernels
@given(
    ranges=st.dictionaries(st.integers(0, 3), st.tuples(st.integers(0, 30), st.integers(0, 10)), max_size=4),
    rows=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 45)), max_size=40),
)
def test_rows_in_ranges_is_the_predicate_on_arrow_rows(
    ranges: dict[int, tuple[int, int]], rows: list[tuple[int, int]]
) -> None:
    """The same membership test the sink checks rows with before a commit, against a plain reading of the ranges."""
    spans = [R(f"t:{p}", start, start + length) for p, (start, length) in ranges.items()]
    table = pa.table(
        {
            "topic": pa.array(["t"] * len(rows), pa.string()),
            "partition": pa.array([p for p, _ in rows], pa.int32()),
            "offset": pa.array([o for _, o in rows], pa.int64()),
        }
    )
    got = rows_in_ranges(table, spans, "kafka", CoordinateColumns()).to_pylist()
    assert got == [any(r.shard == f"t:{p}" and r.start <= o < r.end for r in spans) for p, o in rows]


def test_coordinate_columns_are_names_of_their_own() -> None:
    with pytest.raises(ValueError, match="not a column name"):
        CoordinateColumns(offset="off set")
    with pytest.raises(ValueError, match="a name of its own"):
        CoordinateColumns(topic="x", partition="x")
    assert CoordinateColumns().names("v3io") == ("shard", "sequence_number")


def test_sink_results_show_what_was_counted() -> None:
    assert SinkResult(kind="parquet_ranges", target="/out", rows=None, ranges=2).metadata() == {
        "sink": "parquet_ranges",
        "sink_target": "/out",
        "sink_s": 0.0,
    }
    shown = SinkResult(kind="delta", target="/t", rows=5, ranges=1, conflicts=2, version=7).metadata()
    assert (shown["sink_rows"], shown["sink_conflicts_retried"], shown["sink_version"]) == (5, 2, 7)
    assert DeltaSink.replaces_by_coordinates and not RangeFolderSink.replaces_by_coordinates
