"""Planning Spark input partitions from offset ranges (pure; shared by every stream's data source).

Like Spark's own Kafka source (``KafkaOffsetRangeCalculator``): each shard range becomes one input
partition, ranges larger than ``max_records_per_partition`` are cut into equal pieces, and when fewer
pieces than ``min_partitions`` remain, the large ones are split in proportion to their size so that
every core gets work.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ShardRange:
    """Offsets ``[start, end)`` of one shard (Kafka ``"topic:partition"``, v3io shard number)."""

    shard: str
    start: int
    end: int

    def __post_init__(self) -> None:
        if not isinstance(self.shard, str) or not self.shard:
            raise ValueError(f"range shard must be a non-empty string, got {self.shard!r}")
        for name in ("start", "end"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"range of {self.shard}: {name} must be an integer, got {value!r}")
        if not 0 <= self.start <= self.end:
            raise ValueError(f"range of {self.shard}: need 0 <= start <= end, got [{self.start}, {self.end})")

    @property
    def size(self) -> int:
        return self.end - self.start


def split_evenly(r: ShardRange, parts: int) -> list[ShardRange]:
    """``parts`` contiguous pieces whose sizes differ by at most one record."""
    parts = max(1, min(parts, r.size))
    step, extra = divmod(r.size, parts)
    out, start = [], r.start
    for i in range(parts):
        end = start + step + (1 if i < extra else 0)
        out.append(ShardRange(r.shard, start, end))
        start = end
    return out


def plan_partitions(
    ranges: Iterable[ShardRange],
    *,
    min_partitions: int | None = None,
    max_records_per_partition: int | None = None,
) -> list[ShardRange]:
    """The input partitions for a read: empty ranges dropped, large ones split, order kept."""
    if min_partitions is not None and min_partitions < 1:
        raise ValueError(f"minPartitions must be >= 1, got {min_partitions}")
    if max_records_per_partition is not None and max_records_per_partition < 1:
        raise ValueError(f"maxRecordsPerPartition must be >= 1, got {max_records_per_partition}")
    pieces = [r for r in ranges if r.size > 0]
    shards = [r.shard for r in pieces]
    if len(set(shards)) != len(shards):
        raise ValueError("each shard may appear in only one range per read")
    if max_records_per_partition is not None:
        pieces = [p for r in pieces for p in split_evenly(r, math.ceil(r.size / max_records_per_partition))]
    if min_partitions is None or len(pieces) >= min_partitions:
        return pieces
    total = sum(r.size for r in pieces)
    out: list[ShardRange] = []
    for r in pieces:
        out.extend(split_evenly(r, max(1, round(r.size / total * min_partitions))))
    return out


def pack_partitions(pieces: Sequence[ShardRange], min_records: int | None) -> list[tuple[ShardRange, ...]]:
    """Input partitions as the tasks read them: pieces of fewer than ``min_records`` records share a task, in
    order, until it holds ``min_records`` (None: one piece a task, as Spark's own source plans).

    A task costs a fixed amount (a Kafka consumer made and its partitions fetched from, a Python worker's
    turn, the JVM's scheduling) whatever it reads: a run of a quiet stream holds many ranges of a few hundred
    records each, and reading them in a task each costs more than the records do. Large pieces keep a task of
    their own, so a big read stays as parallel as ``plan_partitions`` made it."""
    if min_records is not None and min_records < 1:
        raise ValueError(f"minRecordsPerPartition must be >= 1, got {min_records}")
    if min_records is None:
        return [(piece,) for piece in pieces]
    out: list[tuple[ShardRange, ...]] = []
    packing: list[ShardRange] = []
    held = 0
    for piece in pieces:
        if piece.size >= min_records:
            out.append((piece,))
            continue
        packing.append(piece)
        held += piece.size
        if held >= min_records:
            out.append(tuple(packing))
            packing, held = [], 0
    if packing:
        out.append(tuple(packing))
    return out


def ranges_to_json(ranges: Sequence[ShardRange]) -> str:
    return json.dumps([{"shard": r.shard, "start": r.start, "end": r.end} for r in ranges])


def ranges_from_json(text: str) -> list[ShardRange]:
    """Parse the ``ranges`` option: ``[{"shard": "orders:0", "start": 0, "end": 100}, ...]``."""
    try:
        items = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"option 'ranges' is not valid JSON: {exc}") from None
    if not isinstance(items, list):
        raise ValueError("option 'ranges' must be a JSON list of {shard, start, end} objects")
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or set(item) != {"shard", "start", "end"}:
            raise ValueError(f"option 'ranges'[{i}] must be an object with exactly shard, start and end: {item!r}")
        out.append(ShardRange(item["shard"], item["start"], item["end"]))
    return out


def as_shard_ranges(ranges: Mapping[str, tuple[int, int]] | Sequence[ShardRange]) -> list[ShardRange]:
    """``{"shard": (start, end)}`` or ShardRanges, as the readers take them, as a list of ShardRanges."""
    if isinstance(ranges, Mapping):
        return [ShardRange(shard, start, end) for shard, (start, end) in ranges.items()]
    return list(ranges)
