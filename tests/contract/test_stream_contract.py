"""The StreamBackend contract, written once and run against every backend's real server (see conftest.py)."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest

from dagster_streamgroup.local.v3io.testing import V3ioServerInfo
from dagster_streamgroup.streams.base import (
    OffsetOutOfRangeError,
    RangeIncompleteError,
    StreamBackend,
    Watermarks,
)
from tests.contract.harness import STREAM_HARNESSES, KafkaHarness, StreamHarness, V3ioHarness
from tests.fixtures.kafka import TopicFactory, unique_name
from tests.fixtures.v3io import unique_v3io_name


@pytest.fixture
def kafka_stream_harness(kafka_bootstrap: str, kafka_topics: TopicFactory) -> StreamHarness:
    return KafkaHarness(kafka_bootstrap, kafka_topics, unique_name("group"))


@pytest.fixture
def v3io_stream_harness(v3io_server: V3ioServerInfo) -> StreamHarness:
    return V3ioHarness(v3io_server, unique_v3io_name("group"))


@pytest.fixture(params=STREAM_HARNESSES)
def harness(request: pytest.FixtureRequest) -> StreamHarness:
    h: StreamHarness = request.getfixturevalue(f"{request.param}_stream_harness")
    return h


def _read(backend: StreamBackend, shard: str, start: int, end: int, batch_size: int = 10_000) -> pa.Table:
    batches = list(backend.read_range(shard, start, end, batch_size=batch_size))
    for batch in batches:
        assert batch.schema.equals(backend.arrow_schema)
    return pa.Table.from_batches(batches, schema=backend.arrow_schema)


def _values(n: int, tag: str = "v") -> list[bytes]:
    return [f"{tag}{i}".encode() for i in range(n)]


def _require(harness: StreamHarness, feature: str) -> None:
    if feature in harness.missing:
        pytest.skip(harness.missing[feature])


@pytest.fixture
def filled(harness: StreamHarness) -> tuple[StreamBackend, str, list[int]]:
    """A 2-shard stream whose second shard holds 12 records."""
    backend = harness.create_stream(2)
    shard = backend.shards()[1]
    offsets = harness.append(backend, shard, _values(12))
    return backend, shard, offsets


def test_shards_are_listed_in_a_stable_order(harness: StreamHarness) -> None:
    backend = harness.create_stream(3)
    first = backend.shards()
    assert len(first) == 3
    assert len(set(first)) == 3
    for _ in range(3):
        assert backend.shards() == first


def test_watermarks_of_empty_and_written_shards(filled: tuple[StreamBackend, str, list[int]]) -> None:
    backend, shard, offsets = filled
    empty = backend.shards()[0]
    marks = backend.watermarks([empty, shard])
    assert set(marks) == {empty, shard}
    assert marks[empty].low == marks[empty].high
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    assert marks[shard] == Watermarks(low=marks[shard].low, high=offsets[-1] + 1)
    assert marks[shard].low <= offsets[0]


def test_a_full_range_reads_exactly_the_written_records(
    filled: tuple[StreamBackend, str, list[int]], harness: StreamHarness
) -> None:
    backend, shard, offsets = filled
    high = backend.watermarks([shard])[shard].high
    table = _read(backend, shard, offsets[0], high)
    assert table.column(harness.value_column).to_pylist() == _values(12)
    assert table.column(harness.offset_column).to_pylist() == offsets


def test_a_range_in_the_middle_reads_only_its_records(
    filled: tuple[StreamBackend, str, list[int]], harness: StreamHarness
) -> None:
    backend, shard, offsets = filled
    table = _read(backend, shard, offsets[3], offsets[7])
    assert table.column(harness.value_column).to_pylist() == _values(12)[3:7]
    assert table.column(harness.offset_column).to_pylist() == offsets[3:7]


def test_an_empty_range_yields_no_records(filled: tuple[StreamBackend, str, list[int]]) -> None:
    backend, shard, offsets = filled
    assert _read(backend, shard, offsets[5], offsets[5]).num_rows == 0


def test_a_range_ending_at_the_high_watermark_includes_the_last_record(
    filled: tuple[StreamBackend, str, list[int]], harness: StreamHarness
) -> None:
    backend, shard, offsets = filled
    high = backend.watermarks([shard])[shard].high
    table = _read(backend, shard, offsets[9], high)
    assert table.column(harness.value_column).to_pylist() == _values(12)[9:]


def test_small_batches_concatenate_to_the_same_records(
    filled: tuple[StreamBackend, str, list[int]], harness: StreamHarness
) -> None:
    backend, shard, offsets = filled
    batches = list(backend.read_range(shard, offsets[0], offsets[-1] + 1, batch_size=5))
    assert all(b.num_rows <= 5 for b in batches)
    assert [v for b in batches for v in b.column(harness.value_column).to_pylist()] == _values(12)


def test_a_range_past_the_data_fails_with_a_clear_error(filled: tuple[StreamBackend, str, list[int]]) -> None:
    backend, shard, offsets = filled
    with pytest.raises(RangeIncompleteError, match=shard):
        _read(backend, shard, offsets[-1], offsets[-1] + 3)


def test_commits_never_move_an_offset_backwards(harness: StreamHarness) -> None:
    backend = harness.create_stream(2)
    a, b = backend.shards()
    harness.append(backend, a, _values(10))
    harness.append(backend, b, _values(1))
    b_low = backend.watermarks([b])[b].low
    assert backend.commit(harness.group, {a: 6}) == {a: 6}
    assert backend.commit(harness.group, {a: 3}) == {a: 6}
    assert backend.committed(harness.group, [a, b]) == {a: 6, b: None}
    assert backend.commit(harness.group, {a: 8, b: b_low}) == {a: 8, b: b_low}
    assert backend.committed(harness.group, [a, b]) == {a: 8, b: b_low}


def test_an_unknown_group_has_no_committed_offsets(filled: tuple[StreamBackend, str, list[int]]) -> None:
    backend, shard, _ = filled
    assert backend.committed("never_used_group_" + str(time.time_ns()), [shard]) == {shard: None}


def test_offset_for_time_finds_the_first_record_at_or_after_the_time(harness: StreamHarness) -> None:
    backend = harness.create_stream(1)
    (shard,) = backend.shards()
    first = harness.append(backend, shard, _values(3, "a"))
    time.sleep(1.2)  # record times (and the local broker's write times) of the two groups must differ
    between_ms = int(time.time() * 1000)
    second = harness.append(backend, shard, _values(3, "b"))
    assert backend.offset_for_time(shard, 0) == first[0]
    assert backend.offset_for_time(shard, between_ms) == second[0]


def test_offset_for_time_after_every_record_is_the_high_watermark(harness: StreamHarness) -> None:
    _require(harness, "offset_for_time_future")
    backend = harness.create_stream(1)
    (shard,) = backend.shards()
    offsets = harness.append(backend, shard, _values(3))
    assert backend.offset_for_time(shard, int(time.time() * 1000) + 3_600_000) == offsets[-1] + 1


def test_a_start_below_retention_raises_offset_out_of_range(
    filled: tuple[StreamBackend, str, list[int]], harness: StreamHarness
) -> None:
    _require(harness, "trim")
    backend, shard, offsets = filled
    harness.trim(backend, shard, offsets[4])
    low = backend.watermarks([shard])[shard].low
    assert low == offsets[4]
    with pytest.raises(OffsetOutOfRangeError) as caught:
        _read(backend, shard, offsets[0], offsets[-1] + 1)
    assert caught.value.low == low
    assert _read(backend, shard, low, offsets[-1] + 1).column(harness.offset_column).to_pylist() == offsets[4:]
