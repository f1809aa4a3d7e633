"""Random bodies, headers, paths and raw bytes must get the platform's error shape (never a stack trace or a
500) and must not stop the server. This test talks raw HTTP with ``http.client`` and raw sockets on purpose:
the v3io client cannot send malformed requests. Afterwards the real client checks the server still works."""

from __future__ import annotations

import contextlib
import http.client
import json
import random
import socket
from typing import Any
from urllib.parse import quote, urlparse

import pytest

from dagster_streamgroup.local.v3io.testing import V3ioServerInfo
from tests.fixtures.v3io import unique_v3io_name
from tests.integration.v3io_server.helpers import CONTAINER

pytestmark = pytest.mark.v3io

FUNCTIONS = [
    "CreateStream",
    "UpdateStream",
    "DescribeStream",
    "PutRecords",
    "SeekShard",
    "Seek",
    "GetRecords",
    "PutItem",
    "UpdateItem",
    "GetItem",
    "GetItems",
    "Bogus",
    "",
    " PutItem ",
]
KEYS = [
    "ShardCount",
    "RetentionPeriodHours",
    "Records",
    "Data",
    "ShardId",
    "PartitionKey",
    "ClientInfo",
    "Type",
    "StartingSequenceNumber",
    "TimestampSec",
    "TimestampNSec",
    "Location",
    "Limit",
    "Item",
    "UpdateMode",
    "ConditionExpression",
    "UpdateExpression",
    "AlternateUpdateExpression",
    "AttributesToGet",
    "FilterExpression",
    "Marker",
    "Segment",
    "TotalSegment",
    "Key",
    "TableName",
    "StreamName",
    "S",
    "N",
    "B",
    "BOOL",
    "TS",
]
EXPRESSIONS = [
    "a == 1",
    "not(exists(state))",
    "((((",
    "a = a + 1",
    "SET a = if_not_exists(a, 0) + 1; REMOVE b",
    "__mtime_secs == 1 AND __mtime_nsecs == 2",
    "x IN (1, 'a')",
    "`weird name` == 'x'",
    "a[1] = 2",
    "1/0",
    "'unterminated",
    "a = 'x' * 2",
    "starts(a)",
    "delete(a)",
    "NOT NOT NOT true",
    "a" * 5000,
]


def _value(rng: random.Random, depth: int = 0) -> Any:
    choice = rng.randrange(9 if depth < 3 else 6)
    if choice == 0:
        return rng.choice([None, True, False])
    if choice == 1:
        return rng.choice([0, -1, 1, 2**63, -(2**70), 3.5, 1e308])
    if choice == 2:
        return rng.choice(EXPRESSIONS)
    if choice == 3:
        return rng.choice(["", "AQAAAAAAAAAAAAAAAAAAAA==", "!!notbase64", "EARLIEST", "SEQUENCE", "TIME", "\u0000"])
    if choice == 4:
        return "".join(chr(rng.randrange(1, 0x3000)) for _ in range(rng.randrange(0, 20)))
    if choice == 5:
        return rng.randrange(-5, 2000)
    if choice == 6:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(0, 4))]
    return {rng.choice(KEYS): _value(rng, depth + 1) for _ in range(rng.randrange(0, 5))}


def _body(rng: random.Random) -> bytes:
    kind = rng.randrange(4)
    if kind == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(0, 200)))
    if kind == 1:
        return json.dumps(_value(rng)).encode()
    return json.dumps({rng.choice(KEYS): _value(rng) for _ in range(rng.randrange(1, 6))}).encode()


def _path(rng: random.Random, stream: str) -> str:
    parts = rng.choice(
        [
            ["", CONTAINER, stream, ""],
            ["", CONTAINER, stream, str(rng.randrange(-2, 6)), ""],
            ["", CONTAINER, "table", "item"],
            ["", CONTAINER, ""],
            ["", "nosuchcontainer", "x"],
            ["", CONTAINER, "..", "x"],
            ["", CONTAINER, "a" * 300],
            ["", ""],
        ]
    )
    return quote("/".join(parts), safe="/")


def test_random_requests_get_clean_errors(v3io_server: V3ioServerInfo, v3io_client: Any) -> None:
    stream = unique_v3io_name("fuzz")
    v3io_client.stream.create(CONTAINER, stream, shard_count=4)
    untouched = unique_v3io_name("untouched")  # a stream the fuzzer never names
    v3io_client.stream.create(CONTAINER, untouched, shard_count=2)
    v3io_client.stream.put_records(CONTAINER, untouched, [{"data": "seed", "shard_id": 1}])
    url = urlparse(v3io_server.endpoint)
    key = v3io_server.access_key.get_secret_value()
    rng = random.Random(20261121)
    statuses: dict[int, int] = {}
    host, port = url.hostname or "127.0.0.1", url.port
    connection = http.client.HTTPConnection(host, port, timeout=10)
    try:
        for _ in range(600):
            headers = {"X-v3io-session-key": key}
            if rng.random() < 0.85:
                headers["X-v3io-function"] = rng.choice(FUNCTIONS)
            if rng.random() < 0.1:
                headers["Range"] = rng.choice(["-1", "bytes=0-", "bytes=x", "bytes=5-2"])
            if rng.random() < 0.05:
                headers.pop("X-v3io-session-key")
            method = rng.choice(["PUT", "POST", "GET", "DELETE", "HEAD", "PATCH"])
            path = _path(rng, stream) + (rng.choice(["", "?prefix=" + stream, "?max-keys=x", "?marker=%00"]))
            connection.request(method, path, body=_body(rng), headers=headers)
            response = connection.getresponse()
            body = response.read()
            statuses[response.status] = statuses.get(response.status, 0) + 1
            assert response.status < 500, (method, path, headers, body)
            if response.status >= 400 and method != "HEAD":
                error = json.loads(body)
                assert set(error) >= {"ErrorCode", "ErrorMessage"}
                assert "Traceback" not in body.decode("utf-8", "replace")
    finally:
        connection.close()
    assert statuses.get(400, 0) > 100  # the fuzzing reached the validators, not just one error path

    for _ in range(30):  # raw garbage on fresh connections: the HTTP layer drops them, the server lives on
        with socket.create_connection((host, port or 0), timeout=5) as sock:
            sock.sendall(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))) + b"\r\n\r\n")
            with contextlib.suppress(TimeoutError, ConnectionResetError):
                sock.recv(4096)

    # the server still serves correctly, and what the fuzzer did not address is intact
    output = v3io_client.stream.put_records(CONTAINER, untouched, [{"data": "after", "shard_id": 1}]).output
    assert output.failed_record_count == 0 and output.records[0].sequence_number == 2
    location = v3io_client.stream.seek(CONTAINER, untouched, 1, "EARLIEST").output.location
    records = v3io_client.stream.get_records(CONTAINER, untouched, 1, location).output.records
    assert [r.data for r in records] == [b"seed", b"after"]
