"""Throughput of the v3io-compatible server through the real ``v3io`` client.

Starts the server (a subprocess on a free 127.0.0.1 port over a temporary data directory), creates a
stream, puts ``--records`` records of ``--record-bytes`` bytes in PutRecords batches of ``--batch``,
then reads every shard back from EARLIEST with GetRecords (limit ``--batch``) and checks that every
record came back in sequence. ``--pipeline N`` keeps N requests in flight with ``client.batch``
(the client's own pipelining over its 8 connections); 1 sends them one by one. A small ``--batch``
(e.g. ``--records 20000 --batch 10``) makes the per-request cost (HTTP parsing and writing) visible, in
``server_cpu_us_per_putrecords`` and ``server_cpu_us_per_getrecords``.

    python -m bench.v3io_server [--records 200000] [--batch 1000] [--shards 4] [--pipeline 1]

The last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import v3io.dataplane

from dagster_streamgroup.local.v3io.testing import V3ioServerProcess

CONTAINER = "bigdata"
STREAM = "bench-stream"
MAX_SECONDS = 120.0


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (Linux ``/proc``): a figure that other load on the machine
    does not inflate the way it inflates wall-clock rates."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _put(client: Any, args: argparse.Namespace) -> tuple[float, list[float]]:
    payload = os.urandom(args.record_bytes)
    batches = args.records // args.batch
    latencies: list[float] = []
    start = time.perf_counter()
    deadline = start + MAX_SECONDS
    sent = 0
    while sent < batches and time.perf_counter() < deadline:
        group = min(args.pipeline, batches - sent)
        records = [
            [{"data": payload, "shard_id": (sent + g) % args.shards} for _ in range(args.batch)] for g in range(group)
        ]
        began = time.perf_counter()
        if args.pipeline == 1:
            responses = [client.stream.put_records(CONTAINER, STREAM, records[0])]
        else:
            for batch in records:
                client.batch.stream.put_records(CONTAINER, STREAM, batch)
            responses = client.batch.wait()
        latencies.append((time.perf_counter() - began) * 1000 / group)
        for response in responses:
            if response.output.failed_record_count:
                raise RuntimeError(f"{response.output.failed_record_count} records failed")
        sent += group
    if sent < batches:
        raise RuntimeError(f"the put phase did not finish within {MAX_SECONDS} s")
    return time.perf_counter() - start, latencies


def _get(client: Any, args: argparse.Namespace) -> tuple[float, list[float], int, int]:
    locations = {
        shard: client.stream.seek(CONTAINER, STREAM, shard, "EARLIEST").output.location for shard in range(args.shards)
    }
    expected_next = dict.fromkeys(range(args.shards), 1)
    latencies: list[float] = []
    received = 0
    requests = 0
    start = time.perf_counter()
    deadline = start + MAX_SECONDS
    while locations and time.perf_counter() < deadline:
        shards = list(locations)[: args.pipeline]
        began = time.perf_counter()
        if args.pipeline == 1:
            outputs = [client.stream.get_records(CONTAINER, STREAM, shards[0], locations[shards[0]], limit=args.batch)]
        else:
            for shard in shards:
                client.batch.stream.get_records(CONTAINER, STREAM, shard, locations[shard], limit=args.batch)
            outputs = client.batch.wait()
        latencies.append((time.perf_counter() - began) * 1000 / len(shards))
        requests += len(shards)
        for shard, response in zip(shards, outputs, strict=True):
            output = response.output
            for record in output.records:
                if record.sequence_number != expected_next[shard] or len(record.data) != args.record_bytes:
                    raise RuntimeError(f"shard {shard}: unexpected record {record.sequence_number}")
                expected_next[shard] += 1
            received += len(output.records)
            if not output.records:
                del locations[shard]
            else:
                locations[shard] = output.next_location
    return time.perf_counter() - start, latencies, received, requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--record-bytes", type=int, default=100)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--pipeline", type=int, default=1, choices=range(1, 9), metavar="1..8")
    args = parser.parse_args()
    if args.records < args.batch:
        parser.error("--records must be at least --batch")

    with tempfile.TemporaryDirectory(prefix="v3io-bench-") as tmp:
        server = V3ioServerProcess(Path(tmp))
        info = server.start()
        try:
            client = v3io.dataplane.Client(**info.client_kwargs(), max_connections=8)
            try:
                client.stream.create(CONTAINER, STREAM, shard_count=args.shards)
                cpu0 = _cpu_seconds(info.pid)
                put_seconds, put_latencies = _put(client, args)
                cpu1 = _cpu_seconds(info.pid)
                written = (args.records // args.batch) * args.batch
                get_seconds, get_latencies, received, get_requests = _get(client, args)
                cpu2 = _cpu_seconds(info.pid)
            finally:
                client.close()
        finally:
            server.stop()
    if received != written:
        raise SystemExit(f"read back {received} records, wrote {written}")

    result = {
        "records": written,
        "record_bytes": args.record_bytes,
        "batch": args.batch,
        "shards": args.shards,
        "pipeline": args.pipeline,
        "put_seconds": round(put_seconds, 3),
        "get_seconds": round(get_seconds, 3),
        "put_records_per_s": round(written / put_seconds),
        "get_records_per_s": round(received / get_seconds),
        "p50_putrecords_ms": round(statistics.median(put_latencies), 2),
        "p99_putrecords_ms": round(_percentile(put_latencies, 0.99), 2),
        "p50_getrecords_ms": round(statistics.median(get_latencies), 2),
        "p99_getrecords_ms": round(_percentile(get_latencies, 0.99), 2),
        "getrecords_requests": get_requests,
        "server_cpu_ms_per_1000_put": round((cpu1 - cpu0) * 1000 / (written / 1000), 2),
        "server_cpu_ms_per_1000_get": round((cpu2 - cpu1) * 1000 / (received / 1000), 2),
        "server_cpu_us_per_putrecords": round((cpu1 - cpu0) * 1e6 / (written // args.batch)),
        "server_cpu_us_per_getrecords": round((cpu2 - cpu1) * 1e6 / get_requests),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
    print(
        f"put {written} records of {args.record_bytes} B in {put_seconds:.2f} s "
        f"({result['put_records_per_s']}/s); read them back in {get_seconds:.2f} s "
        f"({result['get_records_per_s']}/s, GetRecords p99 {result['p99_getrecords_ms']} ms)"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
