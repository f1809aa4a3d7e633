"""Streams through the real client: create/describe/update, PutRecords, the four seek types, GetRecords,
error statuses and bodies, lazy shards, shard assignment and the client's DeleteStream emulation."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fixtures.v3io import unique_v3io_name
from tests.integration.v3io_server.helpers import CONTAINER, NEVER, error_of, raises_status

pytestmark = pytest.mark.v3io


@pytest.fixture
def stream(v3io_client: Any) -> str:
    path = unique_v3io_name("stream")
    assert v3io_client.stream.create(CONTAINER, path, shard_count=4, retention_period_hours=1).status_code == 204
    return path


def test_create_describe_update(v3io_client: Any, stream: str) -> None:
    described = v3io_client.stream.describe(CONTAINER, stream).output
    assert (described.shard_count, described.retention_period_hours) == (4, 1)
    v3io_client.stream.update(CONTAINER, stream, shard_count=6)
    assert v3io_client.stream.describe(CONTAINER, stream).output.shard_count == 6

    shrink = v3io_client.stream.update(CONTAINER, stream, shard_count=2, raise_for_status=NEVER)
    assert shrink.status_code == 400
    assert "InvalidArgumentException" in error_of(shrink)["ErrorMessage"]
    assert v3io_client.stream.describe(CONTAINER, stream).output.shard_count == 6


def test_create_defaults_and_conflicts(v3io_client: Any) -> None:
    path = unique_v3io_name("dir") + "/nested/stream"
    v3io_client.stream.create(CONTAINER, path, shard_count=2)
    assert v3io_client.stream.describe(CONTAINER, path).output.retention_period_hours == 24

    again = v3io_client.stream.create(CONTAINER, path, shard_count=2, raise_for_status=NEVER)
    assert again.status_code == 409
    assert "ResourceInUseException" in error_of(again)["ErrorMessage"]

    bad = v3io_client.stream.create(CONTAINER, unique_v3io_name("s"), shard_count=0, raise_for_status=NEVER)
    assert bad.status_code == 400
    body = error_of(bad)
    assert body["ErrorCode"] == -201326592 and "ShardCount" in body["ErrorMessage"]


def test_missing_stream_is_resource_not_found(v3io_client: Any) -> None:
    missing = unique_v3io_name("missing")
    for response in (
        v3io_client.stream.describe(CONTAINER, missing, raise_for_status=NEVER),
        v3io_client.stream.put_records(CONTAINER, missing, [{"data": "x"}], raise_for_status=NEVER),
        v3io_client.stream.seek(CONTAINER, missing, 0, "EARLIEST", raise_for_status=NEVER),
    ):
        assert response.status_code == 404
        assert "ResourceNotFoundException" in error_of(response)["ErrorMessage"]


def test_put_records_results_and_per_record_failures(v3io_client: Any, stream: str) -> None:
    records = [
        {"data": "first", "shard_id": 1},
        {"data": b"\x00binary", "client_info": b"info", "shard_id": 1},
        {"data": "by key", "partition_key": "user-42"},
        {"data": "out of range", "shard_id": 9},
        {"data": "round robin"},
    ]
    output = v3io_client.stream.put_records(CONTAINER, stream, records).output
    assert output.failed_record_count == 1
    ok = [r for i, r in enumerate(output.records) if i != 3]
    assert all(r.error_code is None and r.error_message is None for r in ok)
    assert [(r.shard_id, r.sequence_number) for r in output.records[:2]] == [(1, 1), (1, 2)]
    failed = output.records[3]
    assert failed.error_code == -201326594 and "ShardIDOutOfRangeException" in failed.error_message
    assert failed.sequence_number is None

    # the same partition key always lands on the same shard while the shard count is fixed
    key_shard = output.records[2].shard_id
    again = v3io_client.stream.put_records(CONTAINER, stream, [{"data": "x", "partition_key": "user-42"}] * 3)
    assert {r.shard_id for r in again.output.records} == {key_shard}


def test_round_robin_spreads_records_over_all_shards(v3io_client: Any, stream: str) -> None:
    output = v3io_client.stream.put_records(CONTAINER, stream, [{"data": str(i)} for i in range(8)]).output
    shards = [r.shard_id for r in output.records]
    assert shards[0] == 0
    assert sorted(shards) == [0, 0, 1, 1, 2, 2, 3, 3]


def test_get_records_round_trip_and_end_of_shard(v3io_client: Any, stream: str) -> None:
    payloads = [f"record-{i}".encode() for i in range(25)]
    v3io_client.stream.put_records(
        CONTAINER, stream, [{"data": p, "shard_id": 2, "partition_key": "k", "client_info": b"ci"} for p in payloads]
    )
    location = v3io_client.stream.seek(CONTAINER, stream, 2, "EARLIEST").output.location
    first = v3io_client.stream.get_records(CONTAINER, stream, 2, location, limit=10).output
    assert [r.sequence_number for r in first.records] == list(range(1, 11))
    assert [r.data for r in first.records] == payloads[:10]
    assert all(r.partition_key == "k" and r.client_info == b"ci" for r in first.records)
    assert first.records_behind_latest == 15
    assert first.records[0].arrival_time_sec > 0

    rest = v3io_client.stream.get_records(CONTAINER, stream, 2, first.next_location).output
    assert [r.data for r in rest.records] == payloads[10:]
    assert rest.records_behind_latest == 0 and rest.msec_behind_latest == 0

    end = v3io_client.stream.get_records(CONTAINER, stream, 2, rest.next_location, limit=5).output
    assert end.records == []
    assert end.next_location == rest.next_location
    assert end.records_behind_latest == 0

    # records without client info or partition key come back without them
    v3io_client.stream.put_records(CONTAINER, stream, [{"data": "plain", "shard_id": 2}])
    plain = v3io_client.stream.get_records(CONTAINER, stream, 2, end.next_location).output.records
    assert [(r.data, r.client_info, r.partition_key, r.sequence_number) for r in plain] == [(b"plain", None, None, 26)]


def test_seek_types_and_last_plus_one(v3io_client: Any, stream: str) -> None:
    v3io_client.stream.put_records(CONTAINER, stream, [{"data": f"a{i}", "shard_id": 0} for i in range(3)])
    middle = v3io_client.stream.get_records(
        CONTAINER, stream, 0, v3io_client.stream.seek(CONTAINER, stream, 0, "EARLIEST").output.location
    ).output.records[-1]
    v3io_client.stream.put_records(CONTAINER, stream, [{"data": f"b{i}", "shard_id": 0} for i in range(3)])

    def read(seek_type: str, **kwargs: Any) -> list[int]:
        location = v3io_client.stream.seek(CONTAINER, stream, 0, seek_type, **kwargs).output.location
        return [
            r.sequence_number for r in v3io_client.stream.get_records(CONTAINER, stream, 0, location).output.records
        ]

    assert read("EARLIEST") == [1, 2, 3, 4, 5, 6]
    assert read("LATEST") == []
    assert read("SEQUENCE", starting_sequence_number=4) == [4, 5, 6]
    assert read("SEQUENCE", starting_sequence_number=7) == []  # last+1: where v3io-go restarts
    # TIME: the first record that arrived at or after the timestamp (the second batch arrived later)
    after_first_batch = middle.arrival_time_sec, middle.arrival_time_nsec + 1
    assert read("TIME", timestamp_sec=after_first_batch[0], timestamp_nsec=after_first_batch[1])[0] == 4
    assert read("TIME", timestamp_sec=0) == [1, 2, 3, 4, 5, 6]  # TimestampNSec null is 0
    assert read("TIME", timestamp_sec=4_000_000_000, timestamp_nsec=0) == []

    beyond = v3io_client.stream.seek(
        CONTAINER, stream, 0, "SEQUENCE", starting_sequence_number=8, raise_for_status=NEVER
    )
    assert beyond.status_code == 400 and "InvalidArgumentException" in error_of(beyond)["ErrorMessage"]


def test_shards_are_created_lazily(v3io_client: Any, stream: str) -> None:
    empty = v3io_client.stream.seek(CONTAINER, stream, 3, "EARLIEST", raise_for_status=NEVER)
    assert empty.status_code == 404 and "ResourceNotFoundException" in error_of(empty)["ErrorMessage"]
    assert v3io_client.kv.get(CONTAINER, stream, "3", raise_for_status=NEVER).status_code == 404

    v3io_client.stream.put_records(CONTAINER, stream, [{"data": "x", "shard_id": 3}])
    shard = v3io_client.kv.get(CONTAINER, stream, "3", attribute_names=["__obj_type", "__last_sequence_num"])
    assert shard.output.item == {"__obj_type": 3, "__last_sequence_num": 1}
    assert v3io_client.stream.seek(CONTAINER, stream, 3, "LATEST").status_code == 200


def test_shard_out_of_range_and_illegal_locations(v3io_client: Any, stream: str) -> None:
    for response in (
        v3io_client.stream.seek(CONTAINER, stream, 4, "EARLIEST", raise_for_status=NEVER),
        v3io_client.stream.get_records(CONTAINER, stream, 7, "AQAAAAAAAAAAAAAAAAAAAA==", raise_for_status=NEVER),
    ):
        assert response.status_code == 400
        assert error_of(response) == {
            "ErrorCode": -201326594,
            "ErrorMessage": error_of(response)["ErrorMessage"],
        }
        assert error_of(response)["ErrorMessage"].startswith("ShardIDOutOfRangeException")

    v3io_client.stream.put_records(CONTAINER, stream, [{"data": "x", "shard_id": 0}, {"data": "y", "shard_id": 1}])
    shard1 = v3io_client.stream.seek(CONTAINER, stream, 1, "EARLIEST").output.location
    for location in ("not base64!", "AQAAAAAAAAAAAAAAAAAAAA==", shard1):
        response = v3io_client.stream.get_records(CONTAINER, stream, 0, location, raise_for_status=NEVER)
        assert response.status_code == 400
        assert "IllegalLocationException" in error_of(response)["ErrorMessage"]


def test_recreated_stream_invalidates_old_locations(v3io_client: Any, stream: str) -> None:
    v3io_client.stream.put_records(CONTAINER, stream, [{"data": "x", "shard_id": 0}])
    old = v3io_client.stream.seek(CONTAINER, stream, 0, "EARLIEST").output.location
    v3io_client.stream.delete(CONTAINER, stream)
    v3io_client.stream.create(CONTAINER, stream, shard_count=4)
    v3io_client.stream.put_records(CONTAINER, stream, [{"data": "new", "shard_id": 0}])
    response = v3io_client.stream.get_records(CONTAINER, stream, 0, old, raise_for_status=NEVER)
    assert response.status_code == 400 and "IllegalLocationException" in error_of(response)["ErrorMessage"]
    fresh = v3io_client.stream.seek(CONTAINER, stream, 0, "EARLIEST").output.location
    records = v3io_client.stream.get_records(CONTAINER, stream, 0, fresh).output.records
    assert [(r.sequence_number, r.data) for r in records] == [(1, b"new")]


def test_delete_stream_with_state_item(v3io_client: Any, stream: str) -> None:
    v3io_client.stream.put_records(CONTAINER, stream, [{"data": "x", "shard_id": s} for s in range(2)])
    v3io_client.kv.put(CONTAINER, stream, "cg0-state.json", {"state": "{}"})
    listed = v3io_client.container.list(CONTAINER, stream + "/").output
    assert sorted(c.key for c in listed.contents) == [f"{stream}/0", f"{stream}/1", f"{stream}/cg0-state.json"]

    v3io_client.stream.delete(CONTAINER, stream)
    assert v3io_client.stream.describe(CONTAINER, stream, raise_for_status=NEVER).status_code == 404
    assert v3io_client.kv.get(CONTAINER, stream, "cg0-state.json", raise_for_status=NEVER).status_code == 404


def test_put_records_bad_input(v3io_client: Any, stream: str) -> None:
    too_many = v3io_client.stream.put_records(CONTAINER, stream, [{"data": "x"}] * 1001, raise_for_status=NEVER)
    assert too_many.status_code == 400
    assert "at most 1000" in error_of(too_many)["ErrorMessage"]
    big_key = v3io_client.stream.put_records(
        CONTAINER, stream, [{"data": "x", "partition_key": "k" * 300}, {"data": "ok"}]
    ).output
    assert big_key.failed_record_count == 1
    assert "PartitionKey" in big_key.records[0].error_message
    assert big_key.records[1].error_code is None


def test_errors_raise_in_the_client(v3io_client: Any) -> None:
    with raises_status(404):
        v3io_client.stream.describe(CONTAINER, unique_v3io_name("nope"))
