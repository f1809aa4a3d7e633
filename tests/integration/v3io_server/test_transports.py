"""Concurrency on the client's 8 pooled connections (``client.batch``) and the aiohttp transport."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import v3io.aio.dataplane

from dagster_streamgroup.local.v3io.testing import V3ioServerInfo
from tests.fixtures.v3io import unique_v3io_name
from tests.integration.v3io_server.helpers import CONTAINER

pytestmark = pytest.mark.v3io


def test_batch_of_eight_in_flight(v3io_client: Any) -> None:
    stream = unique_v3io_name("stream")
    v3io_client.stream.create(CONTAINER, stream, shard_count=8)
    for shard in range(8):
        v3io_client.batch.stream.put_records(
            CONTAINER, stream, [{"data": f"{shard}-{i}", "shard_id": shard} for i in range(50)]
        )
    responses = v3io_client.batch.wait()
    assert [r.status_code for r in responses] == [200] * 8
    assert all(r.output.failed_record_count == 0 for r in responses)

    for shard in range(8):
        v3io_client.batch.stream.seek(CONTAINER, stream, shard, "EARLIEST")
    locations = [r.output.location for r in v3io_client.batch.wait()]
    for shard, location in enumerate(locations):
        v3io_client.batch.stream.get_records(CONTAINER, stream, shard, location)
    for shard, response in enumerate(v3io_client.batch.wait()):
        assert [r.data.decode() for r in response.output.records] == [f"{shard}-{i}" for i in range(50)]

    table = unique_v3io_name("table")
    for i in range(24):  # three rounds of 8 in flight
        v3io_client.batch.kv.put(CONTAINER, table, f"k{i}", {"i": i})
    assert all(r.status_code == 200 for r in v3io_client.batch.wait())
    for i in range(24):
        v3io_client.batch.kv.get(CONTAINER, table, f"k{i}")
    assert [r.output.item["i"] for r in v3io_client.batch.wait()] == list(range(24))


def test_aiohttp_transport(v3io_server: V3ioServerInfo) -> None:
    async def scenario() -> None:
        client = v3io.aio.dataplane.Client(**v3io_server.client_kwargs())
        try:
            stream = unique_v3io_name("stream")
            await client.stream.create(CONTAINER, stream, shard_count=2)
            puts = [
                client.stream.put_records(CONTAINER, stream, [{"data": f"r{i}", "shard_id": i % 2}]) for i in range(10)
            ]
            results = await asyncio.gather(*puts)
            assert all(r.output.failed_record_count == 0 for r in results)
            location = (await client.stream.seek(CONTAINER, stream, 0, "EARLIEST")).output.location
            records = (await client.stream.get_records(CONTAINER, stream, 0, location)).output.records
            assert sorted(r.data for r in records) == sorted(f"r{i}".encode() for i in range(0, 10, 2))

            table = unique_v3io_name("table")
            await client.kv.put(CONTAINER, table, "item1", {"a": 1, "s": "x"})
            await client.kv.update(CONTAINER, table, "item1", expression="a = a + 41")
            item = (await client.kv.get(CONTAINER, table, "item1")).output.item
            assert item == {"a": 42, "s": "x"}
            missing = await client.kv.get(
                CONTAINER, table, "missing", raise_for_status=v3io.aio.dataplane.RaiseForStatus.never
            )
            assert missing.status_code == 404
            items = await client.kv.new_cursor(CONTAINER, table + "/").all()
            assert items == [{"a": 42, "s": "x"}]
            await client.stream.delete(CONTAINER, stream)
        finally:
            await client.close()

    asyncio.run(scenario())
