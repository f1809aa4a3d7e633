"""The v3io backend beyond the shared contract: new shards, retention, the v3io-go committed attribute,
concurrent commits, record fields, and configuration errors. Everything goes through the real server."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import v3io.dataplane
from pydantic import SecretStr, ValidationError

from dagster_streamgroup.local.v3io.testing import V3ioServerInfo, V3ioServerProcess
from dagster_streamgroup.streams.base import OffsetOutOfRangeError, StreamError, Watermarks, seconds_behind
from dagster_streamgroup.streams.v3io import V3IO_ARROW_SCHEMA, V3ioBackend, committed_attribute
from dagster_streamgroup.streams.v3io_config import V3ioStreamConfig
from tests.fixtures.v3io import unique_v3io_name
from tests.integration.v3io.conftest import CONTAINER, NewStream, put, stream_config

pytestmark = pytest.mark.v3io


def _rows(backend: V3ioBackend, shard: str, start: int, end: int, batch_size: int = 10_000) -> pa.Table:
    return pa.Table.from_batches(list(backend.read_range(shard, start, end, batch_size=batch_size)), V3IO_ARROW_SCHEMA)


def test_a_shard_count_increase_appears_as_new_empty_shards(new_stream: NewStream, v3io_client: Any) -> None:
    backend = new_stream(2)
    assert backend.shards() == ["0", "1"]
    v3io_client.stream.update(CONTAINER, backend.config.stream_path, shard_count=5)
    assert backend.shards() == ["0", "1", "2", "3", "4"]
    assert backend.watermarks(["4"]) == {"4": Watermarks(1, 1)}
    put(v3io_client, backend.config.stream_path, 4, [b"x", b"y"])
    assert backend.watermarks(["4"]) == {"4": Watermarks(1, 3)}
    assert _rows(backend, "4", 1, 3).column("data").to_pylist() == [b"x", b"y"]


def test_record_fields_arrive_with_their_exact_types(new_stream: NewStream, v3io_client: Any) -> None:
    backend = new_stream(1)
    path = backend.config.stream_path
    before = time.time()
    put(v3io_client, path, 0, [b"a"], partition_key="user-7", client_info=b"\x01\x02")
    put(v3io_client, path, 0, [b"\x00binary\xff"])
    after = time.time()
    table = _rows(backend, "0", 1, 3)
    assert table.schema.equals(V3IO_ARROW_SCHEMA)
    assert table.column("shard").to_pylist() == [0, 0]
    assert table.column("sequence_number").to_pylist() == [1, 2]
    assert table.column("data").to_pylist() == [b"a", b"\x00binary\xff"]
    assert table.column("partition_key").to_pylist() == ["user-7", None]
    assert table.column("client_info").to_pylist() == [b"\x01\x02", None]
    for stamp in table.column("arrival_time").to_pylist():
        assert before - 1 <= stamp.timestamp() <= after + 1


def test_a_long_range_spans_many_requests_and_stays_exact(v3io_server: V3ioServerInfo, v3io_client: Any) -> None:
    path = unique_v3io_name("stream")
    v3io_client.stream.create(CONTAINER, path, shard_count=1)
    values = [f"r{i}".encode() for i in range(2500)]
    for chunk in range(0, len(values), 1000):
        put(v3io_client, path, 0, values[chunk : chunk + 1000])
    backend = V3ioBackend(stream_config(v3io_server, path, records_per_request=300))
    try:
        batches = list(backend.read_range("0", 7, 2401, batch_size=1000))
        assert max(b.num_rows for b in batches) <= 300
        table = pa.Table.from_batches(batches)
        assert table.column("sequence_number").to_pylist() == list(range(7, 2401))
        assert table.column("data").to_pylist() == values[6:2400]
    finally:
        backend.close()


def test_committed_attribute_is_what_a_v3io_go_reader_expects(new_stream: NewStream, v3io_client: Any) -> None:
    """v3io-go stores the last processed sequence number and resumes at SEQUENCE stored + 1."""
    backend = new_stream(1)
    path = backend.config.stream_path
    put(v3io_client, path, 0, [f"m{i}".encode() for i in range(1, 13)])
    group = unique_v3io_name("cg")
    assert backend.commit(group, {"0": 8}) == {"0": 8}

    attribute = f"__{group}_committed_sequence_number"
    item = v3io_client.kv.get(CONTAINER, path, "0", attribute_names=[attribute]).output.item
    assert item == {attribute: 7}
    location = v3io_client.stream.seek(CONTAINER, path, 0, "SEQUENCE", starting_sequence_number=item[attribute] + 1)
    resumed = v3io_client.stream.get_records(CONTAINER, path, 0, location.output.location, limit=1).output.records
    assert resumed[0].data == _rows(backend, "0", 8, 9).column("data")[0].as_py() == b"m8"

    # And the other way: what a v3io-go member committed (written as it writes: PutItem, no condition).
    v3io_client.kv.update(CONTAINER, path, "0", attributes={attribute: 10})
    assert backend.committed(group, ["0"]) == {"0": 11}
    assert backend.commit(group, {"0": 9}) == {"0": 11}
    assert v3io_client.kv.get(CONTAINER, path, "0", attribute_names=[attribute]).output.item == {attribute: 10}


def test_concurrent_commits_end_at_the_highest_offset(new_stream: NewStream, v3io_server: V3ioServerInfo) -> None:
    backend = new_stream(1)
    put_client = v3io.dataplane.Client(**v3io_server.client_kwargs())
    try:
        put(put_client, backend.config.stream_path, 0, [b"v"] * 100)
    finally:
        put_client.close()
    group = unique_v3io_name("cg")
    offsets = list(range(2, 101))
    errors: list[BaseException] = []

    def worker(mine: list[int]) -> None:
        member = V3ioBackend(backend.config)
        try:
            for offset in mine:
                member.commit(group, {"0": offset})
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            member.close()

    # Four writers interleave rising and falling values; a lower write arriving late must never win.
    slices = [offsets[0::4], offsets[1::4][::-1], offsets[2::4], offsets[3::4][::-1]]
    threads = [threading.Thread(target=worker, args=(s,)) for s in slices]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    assert backend.committed(group, ["0"]) == {"0": 100}


def test_a_start_below_retention_raises_offset_out_of_range(tmp_path: Path) -> None:
    """A server whose retention hour lasts 0.5 s trims the first records once newer ones arrive."""
    server = V3ioServerProcess(tmp_path / "short", env={"STREAMGROUP_V3IO_HOUR_SECONDS": "0.5"})
    info = server.start()
    client = v3io.dataplane.Client(**info.client_kwargs())
    backend = V3ioBackend(stream_config(info, "trimmed"), stall_timeout_s=1.0)
    try:
        client.stream.create(CONTAINER, "trimmed", shard_count=1, retention_period_hours=1)
        put(client, "trimmed", 0, [b"old"] * 4)
        time.sleep(1.0)
        put(client, "trimmed", 0, [f"new{i}".encode() for i in range(8)])
        assert backend.watermarks(["0"]) == {"0": Watermarks(5, 13)}
        with pytest.raises(OffsetOutOfRangeError) as caught:
            _rows(backend, "0", 2, 13)
        assert (caught.value.shard, caught.value.requested, caught.value.low) == ("0", 2, 5)
        assert _rows(backend, "0", 5, 13).column("data").to_pylist() == [f"new{i}".encode() for i in range(8)]
    finally:
        backend.close()
        client.close()
        server.stop()


def test_group_names_must_fit_an_attribute_name(new_stream: NewStream) -> None:
    backend = new_stream(1)
    with pytest.raises(ValueError, match=r"group 'my-group'.*letters, digits and '_'"):
        backend.commit("my-group", {"0": 1})
    assert committed_attribute("cg_1") == "__cg_1_committed_sequence_number"


def test_a_missing_stream_is_a_clear_error(v3io_server: V3ioServerInfo) -> None:
    backend = V3ioBackend(stream_config(v3io_server, unique_v3io_name("absent")))
    try:
        with pytest.raises(StreamError, match="the stream does not exist"):
            backend.shards()
    finally:
        backend.close()


def test_config_errors_name_the_field_and_never_show_the_key(tmp_path: Path) -> None:
    secret = "k3y-that-must-not-leak"
    good = {"endpoint": "127.0.0.1:8081", "container": "bigdata", "stream_path": "/a//clicks/"}
    config = V3ioStreamConfig(**good, access_key=SecretStr(secret))
    assert (config.endpoint, config.stream_path) == ("http://127.0.0.1:8081", "a/clicks")
    assert secret not in repr(config) and secret not in str(config.model_dump())
    for field, bad, reason in [
        ("endpoint", "ftp://host", "scheme"),
        ("endpoint", "http://user:pw@host:1", "credentials"),
        ("container", "bad/name", "container name"),
        ("stream_path", "a/../b", "stream_path part"),
        ("records_per_request", 0, "greater than or equal"),
    ]:
        with pytest.raises(ValidationError) as caught:
            V3ioStreamConfig(**{**good, field: bad}, access_key=SecretStr(secret))
        assert caught.value.errors()[0]["loc"] == (field,) and reason in str(caught.value)
        assert secret not in str(caught.value)
    with pytest.raises(ValidationError, match="either access_key or access_key_file"):
        V3ioStreamConfig(**good, access_key=SecretStr(secret), access_key_file=tmp_path / "k")
    key_file = tmp_path / "key"
    key_file.write_text(secret + "\n")
    assert V3ioStreamConfig(**good, access_key_file=key_file).resolve_access_key() == secret
    with pytest.raises(ValueError, match="access_key_file: cannot read"):
        V3ioStreamConfig(**good, access_key_file=tmp_path / "absent").resolve_access_key()


@pytest.fixture
def locked_server(tmp_path: Path) -> Iterator[V3ioServerInfo]:
    server = V3ioServerProcess(tmp_path / "locked", access_key="the-right-key")
    info = server.start()
    try:
        yield info
    finally:
        server.stop()


def test_a_wrong_access_key_fails_without_showing_it(locked_server: V3ioServerInfo) -> None:
    wrong = "a-wrong-key-0123"
    config = V3ioStreamConfig(
        endpoint=locked_server.endpoint, container=CONTAINER, stream_path="s", access_key=SecretStr(wrong)
    )
    backend = V3ioBackend(config)
    try:
        with pytest.raises(StreamError, match=r"status 40[13]") as caught:
            backend.shards()
        assert wrong not in str(caught.value) and "the-right-key" not in str(caught.value)
    finally:
        backend.close()


def test_seconds_behind_is_the_arrival_time_of_the_first_record_not_committed(
    new_stream: NewStream, v3io_client: Any
) -> None:
    """Each shard's seconds behind counts from the arrival time the server stamped on the record at the committed
    sequence number (the same time a run reads in ``arrival_time``); a caught-up shard and an empty one are 0, and
    a shard nobody commits falls further behind as time passes."""
    backend = new_stream(3)
    path = backend.config.stream_path
    put(v3io_client, path, 0, [b"a", b"b"])
    time.sleep(1.1)  # the records past the committed offset arrive a second later than those before it
    put(v3io_client, path, 0, [b"c", b"d"])
    put(v3io_client, path, 1, [b"x"])
    arrivals = [s.timestamp() for s in _rows(backend, "0", 1, 5).column("arrival_time").to_pylist()]
    committed: dict[str, int | None] = {"0": 3, "1": 2, "2": 1}
    times = backend.record_times({"0": 3, "1": 2, "2": 1})
    assert times["0"] is not None and abs(times["0"] / 1000 - arrivals[2]) < 0.002
    assert times["1"] is None and times["2"] is None  # nothing at or after those offsets yet
    marks = backend.watermarks(backend.shards())
    now_ms = int(time.time() * 1000)
    behind = seconds_behind(backend, committed, marks, now_ms=now_ms)
    assert behind == {"0": (now_ms - times["0"]) / 1000, "1": 0.0, "2": 0.0}
    assert behind["0"] < now_ms / 1000 - arrivals[0]  # the records committed before it do not count
    time.sleep(0.5)
    later = seconds_behind(backend, committed, backend.watermarks(backend.shards()))
    assert later["0"] >= behind["0"] + 0.5 and later["1"] == 0.0
