"""The one interface every stream backend implements (Kafka topic sets, v3io streams).

Shard ids are strings the backend defines (Kafka ``"<topic>:<partition>"``, v3io ``"<shard number>"``),
listed in a stable order. Offsets are *next offset to read*: a range ``[start, end)`` holds the records
with offsets ``start <= o < end``. Backends whose native convention differs (v3io's inclusive
"last processed" sequence number) convert at this edge.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import NamedTuple, Protocol, runtime_checkable

import pyarrow as pa


class Watermarks(NamedTuple):
    low: int
    """First offset still available (retention trims below it)."""
    high: int
    """Next offset a reader can reach: ``[low, high)`` is readable now. Under Kafka's ``read_committed`` this is
    the last stable offset: an open transaction holds every reader there until it commits or aborts."""
    uncommitted_high: int | None = None
    """Where ``high`` is held below what was written (an open transaction): the next offset written, counting
    the open transaction's records (Kafka's ``read_uncommitted`` high watermark). ``None`` otherwise."""

    @property
    def written_end(self) -> int:
        """The end that lag is counted to: what was written, whether readers may see it yet or not."""
        return max(self.high, self.uncommitted_high or 0)

    @property
    def held_by_open_transaction(self) -> bool:
        return self.uncommitted_high is not None and self.uncommitted_high > self.high


def open_transaction_text(stable: int, written: int) -> str:
    """What the status table and the lag observations say of a shard an open transaction holds."""
    return (
        f"waits on an open transaction: held at the last stable offset {stable}, "
        f"{written - stable} record(s) up to {written} not committed or aborted yet"
    )


def seconds_behind_at(now_ms: int, committed: int, written_end: int, record_time_ms: int | None) -> float:
    """How far in time a shard is behind: now minus the time of its first record not yet committed, 0 when
    caught up (or when that record is not readable yet: an open transaction's). Never negative: a producer's
    clock ahead of ours is not a lead."""
    if committed >= written_end or record_time_ms is None:
        return 0.0
    return max(0.0, (now_ms - record_time_ms) / 1000.0)


def seconds_behind(
    backend: StreamBackend,
    committed: Mapping[str, int | None],
    marks: Mapping[str, Watermarks],
    *,
    now_ms: int | None = None,
) -> dict[str, float]:
    """Seconds behind of every shard with a committed offset and watermarks; the backend is asked for record
    times only for the shards that lag (none: no request)."""
    import time

    known = {s: c for s, c in committed.items() if c is not None and s in marks}
    lagging = {s: c for s, c in known.items() if c < marks[s].written_end}
    times = backend.record_times(lagging) if lagging else {}
    now = int(time.time() * 1000) if now_ms is None else now_ms
    return {s: seconds_behind_at(now, c, marks[s].written_end, times.get(s)) for s, c in known.items()}


class StreamListing(NamedTuple):
    """What exists of the stream now, as a member tick needs it (the protocol's ``StreamView``)."""

    shards: list[str]
    """The shards of every part that exists, in a stable order."""
    identities: dict[str, str]
    """The identity of each part's log (Kafka: the topic's id, which a topic deleted and created again changes),
    or of a shard's own (keyed by shard id); empty for a backend that has none."""
    missing: frozenset[str]
    """Parts of the stream that do not exist now (Kafka: topics of the list the cluster does not have)."""
    parts: tuple[str, ...] | None = None
    """The parts this backend's configuration lists (Kafka: its topics); ``None``: the stream has one part."""


class MirroredOffset(NamedTuple):
    """The group's offset as the stream records it, and who wrote it."""

    offset: int
    ours: bool
    """Written by this group's members (Kafka: the commit's metadata carries our marker); ``False``: by something
    else, such as Kafka's consumer-groups tool (a reset), another application, or a version before the marker."""
    identity: str | None = None
    """The identity of the log the members wrote it for, where the marker names one."""


class StreamError(Exception):
    """A backend failure, with the backend's own error kept as ``__cause__``."""


class OffsetOutOfRangeError(StreamError):
    """A requested offset fell out of retention (below the low watermark)."""

    def __init__(self, shard: str, requested: int, low: int) -> None:
        super().__init__(
            f"shard {shard}: offsets [{requested}, {low}) are no longer in the stream (retention); "
            f"the earliest available offset is {low}"
        )
        self.shard = shard
        self.requested = requested
        self.low = low


class RangeIncompleteError(StreamError):
    """A range could not be read to its end (records missing or the stream stopped answering)."""


class CommitRejectedError(StreamError):
    """The backend refused the offset commit (for Kafka: the group has live subscribe() members)."""


class ForeignGroupError(CommitRejectedError):
    """Another application's consumers hold, or own, a group of the same name in the stream (Kafka consumers,
    v3io-go/Nuclio): our members must launch nothing, or that application's offsets move under it."""


@runtime_checkable
class StreamBackend(Protocol):
    @property
    def stream_id(self) -> str:
        """A stable name of the stream (cluster + topics, or container + path), part of the state key."""
        ...

    @property
    def legacy_stream_ids(self) -> list[str]:
        """Names earlier versions gave this stream: a state found under one of them is carried over once."""
        ...

    @property
    def arrow_schema(self) -> pa.Schema:
        """The schema of the record batches ``read_range`` yields."""
        ...

    def shards(self) -> list[str]:
        """All shards that exist now, in a stable order; shards added later appear in later calls. Raises
        ``StreamError`` when a part of the stream does not exist."""
        ...

    def listing(self) -> StreamListing:
        """The shards that exist now, their logs' identities, and the parts of the stream that are missing
        (a member tick goes on with the parts that exist)."""
        ...

    def identities(self, shards: Sequence[str]) -> dict[str, str]:
        """The identity of each shard's log now (keyed by shard), where the backend has one: a run's commit
        compares it with the identity its range was planned under."""
        ...

    def watermarks(self, shards: Sequence[str]) -> dict[str, Watermarks]: ...

    def committed(self, group: str, shards: Sequence[str]) -> dict[str, int | None]:
        """The group's offsets as mirrored in the backend (``None`` where nothing was committed)."""
        ...

    def check_group(self, group: str) -> None:
        """Raise ``ForeignGroupError`` when another application holds or owns ``group`` in the stream."""
        ...

    def group_offsets(self, group: str, shards: Sequence[str]) -> dict[str, MirroredOffset | None]:
        """The group's offsets as the stream records them, and whether this group's members wrote them."""
        ...

    @property
    def watches_group_offsets(self) -> bool:
        """Whether a member reads the group's offsets of all its idle shards at every tick (to catch a reset made
        around the group, and a mirror left behind), or only those of shards it has not positioned yet. Kafka: one
        request for all of them, and an offset something else wrote can be told; v3io: a request per shard, and
        the attribute is only ever the group's own."""
        ...

    def commit(
        self,
        group: str,
        offsets: Mapping[str, int],
        *,
        identities: Mapping[str, str | None] | None = None,
        refresh: bool = False,
        restore: bool = False,
    ) -> dict[str, int]:
        """Mirror the group's offsets into the backend, never moving one backwards.

        ``identities``: the identity of the log each offset counts in (the state's): an offset is not written
        over a log that has another identity now. An offset that something other than the group's members wrote
        is left as it is (the next member tick refuses it visibly and restores the mirror); ``restore`` writes
        the given offsets whatever is stored (a member restoring the mirror, an operator's reset), backwards
        too; ``refresh`` writes an equal offset again (``keep_alive``). Returns the offsets in effect afterwards."""
        ...

    def keep_alive(
        self, group: str, offsets: Mapping[str, int], identities: Mapping[str, str | None] | None = None
    ) -> None:
        """Record again mirrored offsets that the stream would otherwise forget, never moving one (Kafka expires a
        member-less group's offsets ``offsets.retention.minutes`` after their last commit)."""
        ...

    def offset_for_time(self, shard: str, timestamp_ms: int) -> int:
        """The earliest offset whose record time is at or after ``timestamp_ms`` (the high watermark if none)."""
        ...

    def record_times(self, offsets: Mapping[str, int]) -> dict[str, int | None]:
        """The time (ms since the epoch) of the first record at or after each shard's offset, by the records' own
        timestamps (Kafka: the record's timestamp; v3io: its arrival time); ``None`` where no record is there yet.
        One bounded request per call over all the shards: ``seconds_behind`` asks it only for shards with lag."""
        ...

    def read_range(self, shard: str, start: int, end: int, *, batch_size: int = 10_000) -> Iterator[pa.RecordBatch]:
        """Exactly the records of ``[start, end)`` in offset order, as Arrow batches of ``arrow_schema``.

        Raises ``OffsetOutOfRangeError`` when ``start`` is below retention and ``RangeIncompleteError``
        when the range cannot be completed."""
        ...

    def close(self) -> None: ...
