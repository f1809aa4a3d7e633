"""The Confluent wire format: byte 0 is the magic byte ``0``, bytes 1-4 the schema id (big-endian), then the
payload; Protobuf puts the message indexes (the path of the message type in its ``.proto`` file) between the id
and the payload, as zig-zag varints: their count, then each index, with a single ``0`` for the path ``[0]``.

``parse_frames`` reads the headers of a whole Arrow column with numpy (no Python work per record): the range
readers call it on every batch.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

MAGIC_BYTE = 0
HEADER_SIZE = 5


def frame(schema_id: int, payload: bytes, message_indexes: Sequence[int] | None = None) -> bytes:
    """A payload framed as Confluent's serializers frame it (``message_indexes`` for Protobuf)."""
    if not 0 <= schema_id < 2**31:
        raise ValueError(f"schema id must be in [0, 2^31), got {schema_id}")
    head = struct.pack(">bI", MAGIC_BYTE, schema_id)
    if message_indexes is None:
        return head + payload
    return head + encode_message_indexes(message_indexes) + payload


def encode_message_indexes(indexes: Sequence[int]) -> bytes:
    if list(indexes) == [0]:
        return b"\x00"
    return b"".join(zigzag_varint(v) for v in (len(indexes), *indexes))


def zigzag_varint(value: int) -> bytes:
    """A signed integer as Protobuf's and Avro's zigzag varint (Avro's ``long``)."""
    n = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def readzigzag_varint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    """(value, next position); raises ``ValueError`` on a varint that runs past the data or past 64 bits."""
    shift = 0
    result = 0
    while True:
        if pos >= len(data):
            raise ValueError("a varint runs past the end of the record")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError("a varint is longer than 64 bits")


def read_message_indexes(data: bytes | memoryview, pos: int) -> tuple[list[int], int]:
    """The Protobuf message indexes at ``pos`` (just after the schema id), and where the payload starts."""
    count, pos = readzigzag_varint(data, pos)
    if count == 0:
        return [0], pos
    if not 0 < count <= 64:
        raise ValueError(f"message index count {count} is out of range")
    indexes = []
    for _ in range(count):
        index, pos = readzigzag_varint(data, pos)
        if index < 0:
            raise ValueError(f"negative message index {index}")
        indexes.append(index)
    return indexes, pos


def unframe(data: bytes) -> tuple[int, bytes]:
    """(schema id, payload) of one framed record; ``ValueError`` naming what is wrong otherwise."""
    if len(data) < HEADER_SIZE:
        raise ValueError(f"{len(data)} bytes: shorter than the 5-byte header")
    if data[0] != MAGIC_BYTE:
        raise ValueError(f"no magic byte (first byte 0x{data[0]:02x})")
    return struct.unpack(">I", data[1:HEADER_SIZE])[0], data[HEADER_SIZE:]


@dataclass(frozen=True)
class Frames:
    """The headers of a column of framed records."""

    payloads: pa.BinaryArray
    """Every record with its 5-byte header cut off (nulls and records too short for a header: empty)."""
    schema_ids: np.ndarray[Any, np.dtype[np.int64]]
    """The schema id of each record, -1 where it has none."""
    nulls: np.ndarray[Any, np.dtype[np.bool_]]
    too_short: np.ndarray[Any, np.dtype[np.bool_]]
    no_magic: np.ndarray[Any, np.dtype[np.bool_]]
    first_bytes: np.ndarray[Any, np.dtype[np.uint8]]

    @property
    def framed(self) -> np.ndarray[Any, np.dtype[np.bool_]]:
        return self.schema_ids >= 0


def binary_column(array: pa.Array | pa.ChunkedArray) -> pa.BinaryArray:
    """``array`` as one ``binary`` array (the readers' key and value columns; a chunked one is combined)."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
    if array.type != pa.binary():
        array = array.cast(pa.binary())
    assert isinstance(array, pa.BinaryArray)
    return array


def parse_frames(array: pa.Array | pa.ChunkedArray) -> Frames:
    """The headers of every record of a binary column, read with numpy."""
    column = binary_column(array)
    n = len(column)
    if n == 0:
        empty = np.zeros(0, dtype=np.bool_)
        return Frames(pa.array([], pa.binary()), np.zeros(0, np.int64), empty, empty, empty, np.zeros(0, np.uint8))
    nulls = column.is_null().to_numpy(zero_copy_only=False)
    lengths = pc.fill_null(pc.binary_length(column), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    offsets_buffer, data_buffer = column.buffers()[1], column.buffers()[2]
    offsets = np.frombuffer(offsets_buffer, dtype=np.int32, count=n + 1, offset=column.offset * 4).astype(np.int64)
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    starts = offsets[:-1]
    present = ~nulls & (lengths > 0)
    first = np.zeros(n, dtype=np.uint8)
    first[present] = data[starts[present]]
    long_enough = ~nulls & (lengths >= HEADER_SIZE)
    magic = long_enough & (first == MAGIC_BYTE)
    ids = np.full(n, -1, dtype=np.int64)
    at = starts[magic]
    ids[magic] = (
        (data[at + 1].astype(np.int64) << 24)
        | (data[at + 2].astype(np.int64) << 16)
        | (data[at + 3].astype(np.int64) << 8)
        | data[at + 4].astype(np.int64)
    )
    # An explicit stop: pyarrow 26's binary_slice without one fails on some arrays ("Negative buffer resize").
    payloads = pc.fill_null(pc.binary_slice(column, HEADER_SIZE, 2**31 - 1), b"")
    return Frames(
        payloads=binary_column(payloads),
        schema_ids=ids,
        nulls=nulls,
        too_short=~nulls & (lengths < HEADER_SIZE),
        no_magic=long_enough & (first != MAGIC_BYTE),
        first_bytes=first,
    )


def header_error(frames: Frames, i: int) -> str:
    """Why record ``i`` has no header."""
    if frames.nulls[i]:
        return "null (a tombstone)"
    if frames.too_short[i]:
        return "shorter than the 5-byte header of the Confluent wire format"
    return f"no magic byte (first byte 0x{int(frames.first_bytes[i]):02x}): not in the Confluent wire format"
