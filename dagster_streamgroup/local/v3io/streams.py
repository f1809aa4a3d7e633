"""Streams: CreateStream, UpdateStream, DescribeStream, PutRecords, Seek/SeekShard, GetRecords.

A stream is a directory with a shard count and a retention period. Shard ``i`` is the object
``<stream>/<i>`` (``__obj_type`` 3), created by its first record; sequence numbers start at 1 and grow
by one per record. Retention trims the oldest records lazily, when new ones arrive; sequence numbers
never restart. Locations are opaque to clients and name (shard id, next sequence number, shard
incarnation), so a location from a deleted and re-created stream is refused as illegal.
"""

from __future__ import annotations

import base64
import binascii
import struct
import time
import zlib
from dataclasses import dataclass
from typing import Any

import orjson

from dagster_streamgroup.local.v3io import errors, namespace, paths
from dagster_streamgroup.local.v3io.paths import Target
from dagster_streamgroup.local.v3io.protocol import JSON, Request, Response, json_body, json_response, optional_int
from dagster_streamgroup.local.v3io.storage import KIND_DIRECTORY, ShardRow, Storage, StreamRow

MAX_SHARDS = 4096
DEFAULT_RETENTION_HOURS = 24
MAX_RECORDS_PER_PUT = 1000
MAX_RECORD_BYTES = 1 << 20
MAX_CLIENT_INFO_BYTES = 16
MAX_PARTITION_KEY_BYTES = 256
DEFAULT_GET_LIMIT = 1000
MAX_GET_LIMIT = 10000
MAX_GET_BYTES = 10 << 20
_LOCATION = struct.Struct("<IIQQ")
_LOCATION_VERSION = 1
_NS = 1_000_000_000


@dataclass
class StreamSettings:
    hour_seconds: float = 3600.0
    """Length of one retention hour; tests shorten it to watch retention work."""


class StreamEngine:
    def __init__(self, store: Storage, settings: StreamSettings | None = None) -> None:
        self.store = store
        self.settings = settings or StreamSettings()
        self._round_robin: dict[int, int] = {}

    # --- lookups --------------------------------------------------------------------------------------

    def _stream(self, container: str, path: str) -> StreamRow:
        node = self.store.get_node(container, path)
        if node is None:
            raise errors.resource_not_found(f"stream {path!r} does not exist")
        stream = self.store.get_stream(node) if node.kind == KIND_DIRECTORY else None
        if stream is None:
            raise errors.not_a_stream(path)
        return stream

    def _shard_target(self, target: Target) -> tuple[StreamRow, int]:
        stream_path, name = paths.split(target.path)
        if not stream_path:
            raise errors.stream_invalid(f"the URL must name a shard as <stream>/<shard id>/, got {target.path!r}")
        try:
            shard_id = int(name)
        except ValueError:
            raise errors.stream_invalid(f"shard id {name[:40]!r} in the URL is not an integer") from None
        stream = self._stream(target.container, stream_path)
        if not 0 <= shard_id < stream.shard_count:
            raise errors.shard_out_of_range(shard_id, stream.shard_count)
        return stream, shard_id

    # --- stream management ----------------------------------------------------------------------------

    def create(self, target: Target, request: Request) -> Response:
        body = json_body(request)
        path = target.path
        name = body.get("StreamName")
        if name is not None:
            if not isinstance(name, str) or not name.strip("/"):
                raise errors.stream_invalid("StreamName must be a non-empty string")
            path = paths.join(path, paths.normalise(name))
        if not path:
            raise errors.stream_invalid("the URL must name the stream (a container cannot be a stream)")
        shard_count = optional_int(body, "ShardCount", minimum=1, maximum=MAX_SHARDS, stream=True)
        if shard_count is None:
            raise errors.stream_invalid("ShardCount is required")
        retention = optional_int(body, "RetentionPeriodHours", stream=True)
        if retention is None or retention <= 0:
            retention = DEFAULT_RETENTION_HOURS
        with self.store.transaction():
            if self.store.get_node(target.container, path) is not None:
                raise errors.resource_in_use(path)
            namespace.ensure_directory(self.store, target.container, paths.split(path)[0])
            node = self.store.create_node(target.container, path, KIND_DIRECTORY)
            self.store.create_stream(node, shard_count, retention)
        return Response(204)

    def update(self, target: Target, request: Request) -> Response:
        body = json_body(request)
        shard_count = optional_int(body, "ShardCount", minimum=1, maximum=MAX_SHARDS, stream=True)
        if shard_count is None:
            raise errors.stream_invalid("ShardCount is required")
        with self.store.transaction():
            stream = self._stream(target.container, target.path)
            if shard_count < stream.shard_count:
                raise errors.stream_invalid(
                    f"ShardCount can only grow: the stream has {stream.shard_count} shards, asked for {shard_count}"
                )
            self.store.set_shard_count(stream, shard_count)
        return Response(200)

    def describe(self, target: Target, request: Request) -> Response:
        stream = self._stream(target.container, target.path)
        return json_response({"ShardCount": stream.shard_count, "RetentionPeriodHours": stream.retention_hours})

    # --- writing --------------------------------------------------------------------------------------

    def put_records(self, target: Target, request: Request) -> Response:
        body = json_body(request)
        records = body.get("Records")
        if not isinstance(records, list) or not records:
            raise errors.stream_invalid("Records must be a non-empty list")
        if len(records) > MAX_RECORDS_PER_PUT:
            raise errors.stream_invalid(
                f"Records holds {len(records)} records; at most {MAX_RECORDS_PER_PUT} per request"
            )
        a2b = binascii.a2b_base64
        with self.store.transaction():
            stream = self._stream(target.container, target.path)
            shard_count = stream.shard_count
            now = time.time_ns()
            cutoff = now - int(stream.retention_hours * self.settings.hour_seconds * _NS)
            # shard id -> [shard row, next sequence number, arrival secs, arrival nsecs, stored records]
            open_shards: dict[int, list[Any]] = {}
            results: list[dict[str, Any]] = []
            failed = 0
            for index, record in enumerate(records):
                # Fast path for the common shape {"Data": ..., "ShardId": n}; anything else is checked in full.
                data = record.get("Data") if type(record) is dict else None
                shard_id = record.get("ShardId") if type(record) is dict else None
                out: dict[str, Any] | None = None
                sid = -1
                if type(shard_id) is int and type(data) is str and len(record) == 2 and 0 <= shard_id < shard_count:
                    try:
                        size = len(a2b(data, strict_mode=True))
                    except (binascii.Error, ValueError):
                        size = -1
                    if 0 <= size <= MAX_RECORD_BYTES:
                        sid = shard_id
                        out = {"ArrivalTimeSec": 0, "ArrivalTimeNSec": 0, "SequenceNumber": 0, "Data": data}
                if out is None:
                    try:
                        sid, out = self._check_record(stream, record, index)
                    except errors.V3ioError as exc:
                        results.append({"ErrorCode": exc.code, "ErrorMessage": exc.message})
                        failed += 1
                        continue
                state = open_shards.get(sid)
                if state is None:
                    state = open_shards[sid] = self._open_shard(stream, sid, now, cutoff)
                seq = state[1]
                state[1] = seq + 1
                out["ArrivalTimeSec"] = state[2]
                out["ArrivalTimeNSec"] = state[3]
                out["SequenceNumber"] = seq
                state[4].append(out)
                results.append({"SequenceNumber": seq, "ShardId": sid})
            for shard, next_seq, secs, nsecs, stored in open_shards.values():
                self.store.append_chunk(shard, next_seq - 1, secs * _NS + nsecs, orjson.dumps(stored))
        return json_response({"FailedRecordCount": failed, "Records": results})

    def _open_shard(self, stream: StreamRow, shard_id: int, now: int, cutoff: int) -> list[Any]:
        """Materialise the shard if needed, apply retention, and fix this request's arrival time for it."""
        shard = self.store.get_shard(stream.node_id, shard_id) or self.store.create_shard(stream, shard_id)
        self.store.trim(shard, cutoff)
        secs, nsecs = divmod(max(now, shard.last_arrival_ns), _NS)
        return [shard, shard.last_seq + 1, secs, nsecs, []]

    def _check_record(self, stream: StreamRow, record: object, index: int) -> tuple[int, dict[str, Any]]:
        """The record's shard and its stored form (what GetRecords returns, minus arrival and sequence)."""
        where = f"Records[{index}]"
        if not isinstance(record, dict):
            raise errors.stream_invalid(f"{where} must be an object")
        data = record.get("Data")
        if not isinstance(data, str):
            raise errors.stream_invalid(f"{where}.Data must be a base64 string")
        if _b64_size(data, f"{where}.Data") > MAX_RECORD_BYTES:
            raise errors.stream_invalid(f"{where}.Data is larger than {MAX_RECORD_BYTES} bytes")
        out: dict[str, Any] = {"ArrivalTimeSec": 0, "ArrivalTimeNSec": 0, "SequenceNumber": 0, "Data": data}
        info = record.get("ClientInfo")
        if info is not None:
            if not isinstance(info, str):
                raise errors.stream_invalid(f"{where}.ClientInfo must be a base64 string")
            if _b64_size(info, f"{where}.ClientInfo") > MAX_CLIENT_INFO_BYTES:
                raise errors.stream_invalid(f"{where}.ClientInfo is larger than {MAX_CLIENT_INFO_BYTES} bytes")
            out["ClientInfo"] = info
        key = record.get("PartitionKey")
        if key is not None:
            if not isinstance(key, str):
                raise errors.stream_invalid(f"{where}.PartitionKey must be a string")
            if len(key.encode("utf-8", "surrogatepass")) > MAX_PARTITION_KEY_BYTES:
                raise errors.stream_invalid(f"{where}.PartitionKey is longer than {MAX_PARTITION_KEY_BYTES} bytes")
            out["PartitionKey"] = key
        shard_id = record.get("ShardId")
        if shard_id is not None:
            if isinstance(shard_id, bool) or not isinstance(shard_id, int):
                raise errors.stream_invalid(f"{where}.ShardId must be an integer")
            if not 0 <= shard_id < stream.shard_count:
                raise errors.shard_out_of_range(shard_id, stream.shard_count)
        elif key is not None:
            shard_id = zlib.crc32(key.encode("utf-8", "surrogatepass")) % stream.shard_count
        else:
            shard_id = self._round_robin.get(stream.node_id, 0) % stream.shard_count
            self._round_robin[stream.node_id] = shard_id + 1
        return shard_id, out

    # --- reading --------------------------------------------------------------------------------------

    def seek(self, target: Target, request: Request) -> Response:
        body = json_body(request)
        stream, shard_id = self._shard_target(target)
        seek_type = body.get("Type")
        if seek_type not in ("EARLIEST", "LATEST", "SEQUENCE", "TIME"):
            raise errors.stream_invalid(f"Type {seek_type!r} is not one of EARLIEST, LATEST, SEQUENCE, TIME")
        # Validate the arguments before looking at the shard, so bad input is named even on an empty shard.
        sequence = optional_int(body, "StartingSequenceNumber", stream=True)
        if seek_type == "SEQUENCE" and sequence is None:
            raise errors.stream_invalid("StartingSequenceNumber is required for Type SEQUENCE")
        seconds = optional_int(body, "TimestampSec", stream=True)
        nanos = optional_int(body, "TimestampNSec", minimum=0, maximum=_NS - 1, stream=True) or 0
        if seek_type == "TIME" and seconds is None:
            raise errors.stream_invalid("TimestampSec is required for Type TIME")
        shard = self.store.get_shard(stream.node_id, shard_id)
        if shard is None:
            raise errors.resource_not_found(f"shard {shard_id} of {stream.path!r} has no records yet")
        if seek_type == "EARLIEST":
            position = shard.first_seq
        elif seek_type == "LATEST":
            position = shard.last_seq + 1
        elif seek_type == "SEQUENCE":
            assert sequence is not None
            if not shard.first_seq <= sequence <= shard.last_seq + 1:
                raise errors.stream_invalid(
                    f"StartingSequenceNumber {sequence} is outside the shard's records "
                    f"[{shard.first_seq}, {shard.last_seq}] (or {shard.last_seq + 1}, the end)"
                )
            position = sequence
        else:
            assert seconds is not None
            position = self.store.first_seq_at_or_after(shard, seconds * _NS + nanos)
        return json_response({"Location": encode_location(shard, position)})

    def get_records(self, target: Target, request: Request) -> Response:
        body = json_body(request)
        stream, shard_id = self._shard_target(target)
        location = body.get("Location")
        if not isinstance(location, str):
            raise errors.illegal_location("Location must be the string a Seek or GetRecords returned")
        limit = optional_int(body, "Limit", minimum=1, stream=True) or DEFAULT_GET_LIMIT
        limit = min(limit, MAX_GET_LIMIT)
        loc_shard, position, incarnation = decode_location(location)
        if loc_shard != shard_id:
            raise errors.illegal_location(f"the location belongs to shard {loc_shard}, not {shard_id}")
        shard = self.store.get_shard(stream.node_id, shard_id)
        if shard is None or shard.node_id != incarnation:
            raise errors.illegal_location("the location belongs to a shard that no longer exists")
        if position < shard.first_seq:
            raise errors.illegal_location(
                f"records before {shard.first_seq} were removed by retention (location points at {position})"
            )
        if position > shard.last_seq + 1:
            raise errors.illegal_location(f"the location points past the end of the shard ({position})")
        parts: list[bytes] = []
        count = 0
        size = 0
        last_seq = position - 1
        last_arrival = 0
        for first, last, arrival, chunk in self.store.read_chunks(shard, position, limit):
            start = max(first, position)
            stop = min(last, start + (limit - count) - 1)
            if parts and size + len(chunk) > MAX_GET_BYTES:
                break
            if start == first and stop == last:
                parts.append(chunk[1:-1])
            else:
                selected = orjson.loads(chunk)[start - first : stop - first + 1]
                parts.append(orjson.dumps(selected)[1:-1])
            size += len(chunk)
            count += stop - start + 1
            last_seq, last_arrival = stop, arrival
            if count >= limit:
                break
        if count:
            behind = shard.last_seq - last_seq
            msec_behind = (shard.last_arrival_ns - last_arrival) // 1_000_000
        else:
            behind = msec_behind = 0
        head = orjson.dumps(
            {
                "NextLocation": encode_location(shard, last_seq + 1),
                "MSecBehindLatest": msec_behind,
                "RecordsBehindLatest": behind,
            }
        )
        return Response(200, b"".join((head[:-1], b',"Records":[', b",".join(parts), b"]}")), JSON)


def encode_location(shard: ShardRow, position: int) -> str:
    return base64.b64encode(_LOCATION.pack(_LOCATION_VERSION, shard.shard_id, position, shard.node_id)).decode()


def decode_location(location: str) -> tuple[int, int, int]:
    """(shard id, next sequence number, shard incarnation) of a location this server issued."""
    try:
        raw = base64.b64decode(location.encode("ascii"), validate=True)
    except (binascii.Error, ValueError, UnicodeError):
        raise errors.illegal_location("Location is not base64") from None
    if len(raw) != _LOCATION.size:
        raise errors.illegal_location("Location was not issued by this server")
    version, shard_id, position, incarnation = _LOCATION.unpack(raw)
    if version != _LOCATION_VERSION:
        raise errors.illegal_location("Location was not issued by this server")
    return shard_id, position, incarnation


def _b64_size(text: str, where: str) -> int:
    try:
        return len(binascii.a2b_base64(text, strict_mode=True))
    except (binascii.Error, ValueError):
        raise errors.stream_invalid(f"{where} is not valid base64") from None
