"""Servers of their own: restart durability, a SIGKILL during a put loop, the access-key check, and
retention trimming with a shortened retention hour."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import v3io.dataplane

from dagster_streamgroup.local.v3io.testing import V3ioServerProcess
from tests.integration.v3io_server.helpers import CONTAINER, NEVER, error_of

pytestmark = pytest.mark.v3io


def _client(server: V3ioServerProcess, **kwargs: Any) -> Any:
    return v3io.dataplane.Client(**{**server.info.client_kwargs(), **kwargs})


def _read_all(client: Any, stream: str, shard: int) -> list[bytes]:
    location = client.stream.seek(CONTAINER, stream, shard, "EARLIEST").output.location
    out: list[bytes] = []
    for _ in range(10_000):
        output = client.stream.get_records(CONTAINER, stream, shard, location).output
        if not output.records:
            return out
        out.extend(r.data for r in output.records)
        location = output.next_location
    raise AssertionError("the shard did not end")


def test_data_survives_a_restart(tmp_path: Path) -> None:
    server = V3ioServerProcess(tmp_path / "data")
    try:
        server.start()
        client = _client(server)
        client.stream.create(CONTAINER, "s", shard_count=2)
        client.stream.put_records(CONTAINER, "s", [{"data": f"r{i}", "shard_id": 0} for i in range(10)])
        client.kv.put(CONTAINER, "t", "item", {"a": 1})
        client.object.put(CONTAINER, "o.bin", body=b"\x00\x01")
        before = client.kv.get(CONTAINER, "t", "item", attribute_names=["__mtime_secs", "__mtime_nsecs"]).output.item
        client.close()

        server.restart()
        client = _client(server)
        assert client.stream.describe(CONTAINER, "s").output.shard_count == 2
        assert _read_all(client, "s", 0) == [f"r{i}".encode() for i in range(10)]
        after = client.kv.get(CONTAINER, "t", "item", attribute_names=["**"]).output.item
        assert after["a"] == 1
        assert (after["__mtime_secs"], after["__mtime_nsecs"]) == (before["__mtime_secs"], before["__mtime_nsecs"])
        assert client.object.get(CONTAINER, "o.bin").body == b"\x00\x01"
        # sequence numbers continue after the restart and mtimes keep moving forward
        put = client.stream.put_records(CONTAINER, "s", [{"data": "next", "shard_id": 0}]).output
        assert put.records[0].sequence_number == 11
        client.kv.put(CONTAINER, "t", "item", {"a": 2})
        newer = client.kv.get(CONTAINER, "t", "item", attribute_names=["__mtime_secs", "__mtime_nsecs"]).output.item
        assert (newer["__mtime_secs"], newer["__mtime_nsecs"]) > (before["__mtime_secs"], before["__mtime_nsecs"])
        client.close()
    finally:
        server.stop()


def test_sigkill_during_put_loop_loses_no_acknowledged_record(tmp_path: Path) -> None:
    server = V3ioServerProcess(tmp_path / "data")
    acknowledged: list[tuple[int, int, bytes]] = []
    try:
        server.start()
        client = _client(server)
        client.stream.create(CONTAINER, "s", shard_count=2)
        client.kv.put(CONTAINER, "t", "counter", {"n": 0})
        stop = threading.Event()
        last_counter: list[int] = [0]

        def put_loop() -> None:
            # Short timeouts so the loop notices the dead server quickly; errors end the loop.
            writer = _client(server)
            try:
                for batch in range(10_000):
                    if stop.is_set():
                        return
                    payloads = [f"b{batch}-{i}".encode() for i in range(100)]
                    records = [{"data": data, "shard_id": i % 2} for i, data in enumerate(payloads)]
                    output = writer.stream.put_records(CONTAINER, "s", records).output
                    for data, result in zip(payloads, output.records, strict=True):
                        acknowledged.append((result.shard_id, result.sequence_number, data))
                    writer.kv.put(CONTAINER, "t", "counter", {"n": batch + 1})
                    last_counter[0] = batch + 1
            except Exception:
                return
            finally:
                writer.close()

        thread = threading.Thread(target=put_loop)
        thread.start()
        deadline = time.monotonic() + 30
        while len(acknowledged) < 2000 and time.monotonic() < deadline and thread.is_alive():
            time.sleep(0.01)
        server.kill()  # SIGKILL mid-loop
        stop.set()
        thread.join(timeout=60)
        assert not thread.is_alive()
        assert len(acknowledged) >= 2000

        server.start()
        client = _client(server)
        stored = {shard: _read_all(client, "s", shard) for shard in (0, 1)}
        for shard, seq, data in acknowledged:
            assert stored[shard][seq - 1] == data
        assert client.kv.get(CONTAINER, "t", "counter").output.item["n"] >= last_counter[0]
        client.close()
    finally:
        server.stop()


def test_access_key_is_checked_when_configured(tmp_path: Path) -> None:
    server = V3ioServerProcess(tmp_path / "data", access_key="the-right-key")
    try:
        server.start()
        good = _client(server)
        good.kv.put(CONTAINER, "t", "item", {"a": 1})
        bad = _client(server, access_key="a-wrong-key")
        response = bad.kv.get(CONTAINER, "t", "item", raise_for_status=NEVER)
        assert response.status_code == 403
        body = error_of(response)
        assert body["ErrorCode"] == -1 and "a-wrong-key" not in response.body.decode()
        good.close()
        bad.close()
        log = (tmp_path / "data" / "server.log").read_text()
        assert "the-right-key" not in log and "a-wrong-key" not in log
    finally:
        server.stop()


def test_retention_trims_oldest_records(tmp_path: Path) -> None:
    # one retention "hour" lasts 0.3 s here, so a 1-hour stream keeps records for 0.3 s
    server = V3ioServerProcess(tmp_path / "data", env={"STREAMGROUP_V3IO_HOUR_SECONDS": "0.3"})
    try:
        server.start()
        client = _client(server)
        client.stream.create(CONTAINER, "s", shard_count=1, retention_period_hours=1)
        client.stream.put_records(CONTAINER, "s", [{"data": f"old{i}", "shard_id": 0} for i in range(5)])
        old_location = client.stream.seek(CONTAINER, "s", 0, "EARLIEST").output.location
        time.sleep(0.6)
        client.stream.put_records(CONTAINER, "s", [{"data": f"new{i}", "shard_id": 0} for i in range(3)])

        assert _read_all(client, "s", 0) == [f"new{i}".encode() for i in range(3)]
        earliest = client.stream.seek(CONTAINER, "s", 0, "EARLIEST").output.location
        first = client.stream.get_records(CONTAINER, "s", 0, earliest).output.records[0]
        assert first.sequence_number == 6  # sequence numbers never restart
        stale = client.stream.get_records(CONTAINER, "s", 0, old_location, raise_for_status=NEVER)
        assert stale.status_code == 400 and "IllegalLocationException" in error_of(stale)["ErrorMessage"]
        below = client.stream.seek(CONTAINER, "s", 0, "SEQUENCE", starting_sequence_number=2, raise_for_status=NEVER)
        assert below.status_code == 400
        client.close()
    finally:
        server.stop()
