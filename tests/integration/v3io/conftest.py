"""Shared pieces of the v3io backend, store and Spark tests (all through the real server and client).

The session-scoped ``spark`` fixture is the one of tests/integration/spark, imported here so both folders
share one local Spark session."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import v3io.dataplane

from dagster_streamgroup.local.v3io.testing import V3ioServerInfo
from dagster_streamgroup.streams.v3io import V3ioBackend
from dagster_streamgroup.streams.v3io_config import V3ioStreamConfig
from tests.fixtures.v3io import unique_v3io_name
from tests.integration.spark.conftest import spark  # noqa: F401  (the shared session fixture)

CONTAINER = "bigdata"
NewStream = Callable[[int], V3ioBackend]


def stream_config(server: V3ioServerInfo, path: str, **extra: Any) -> V3ioStreamConfig:
    return V3ioStreamConfig(
        endpoint=server.endpoint, container=CONTAINER, stream_path=path, access_key=server.access_key, **extra
    )


def put(client: Any, path: str, shard: int, values: Sequence[bytes], **fields: Any) -> list[int]:
    """Append records to one shard through the real client; their sequence numbers."""
    records = [{"shard_id": shard, "data": v, **fields} for v in values]
    out = client.stream.put_records(CONTAINER, path, records).output
    assert out.failed_record_count == 0
    return [r.sequence_number for r in out.records]


@pytest.fixture
def new_stream(v3io_server: V3ioServerInfo) -> Iterator[NewStream]:
    """Create fresh streams; their backends are closed at the end of the test."""
    made: list[V3ioBackend] = []
    client = v3io.dataplane.Client(**v3io_server.client_kwargs())

    def make(shards: int, **extra: Any) -> V3ioBackend:
        path = unique_v3io_name("stream")
        client.stream.create(CONTAINER, path, shard_count=shards)
        backend = V3ioBackend(stream_config(v3io_server, path, **extra), stall_timeout_s=1.0)
        made.append(backend)
        return backend

    try:
        yield make
    finally:
        for backend in made:
            backend.close()
        client.close()
