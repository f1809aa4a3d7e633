"""The v3io stream backend (the ``v3io`` client): shards ``"0"``, ``"1"``, ... of one v3io stream.

Offsets are v3io sequence numbers, which start at 1 in every shard and grow by one per record, so a shard
with no records has the watermarks ``(1, 1)`` and a shard whose last record is ``s`` has ``high = s + 1``.
Shards come from DescribeStream: a shard-count increase shows up as new shard ids. Shard objects exist
only after their first record (the platform creates them lazily), which is why a missing shard reads as
empty rather than as an error.

The group's offsets are mirrored into the shard attribute that v3io-go and Nuclio use,
``__<group>_committed_sequence_number``, in their convention: the sequence number of the *last processed*
record. Our committed offset ``c`` (next to read) is stored as ``c - 1``. Writes are conditional
(``__obj_type == 3`` as v3io-go guards shard commits, and "absent or lower"), so a concurrent writer of a
lower value can never move the attribute backwards. Each write also sets ``__<group>_streamgroup_mirrored`` to
the same value, so an attribute that holds anything else was set around the group (Nuclio's way to replay a
trigger's group): a member tick refuses it with a ``reset_refused`` event and restores it, and a commit leaves
it for that tick rather than overwrite it unseen. ``streamgroup reset`` is the supported way to move a group.

Each shard object carries the identity of its log (``IDENTITY_ATTRIBUTE``), so a stream deleted and created
again at its path is told from the old one whatever its records; and an item beside the shards
(``group_marker_item``) says the group has positioned the stream, for the shards whose lack of records leaves
no object to hold an offset.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import v3io.dataplane
from v3io.dataplane.response import HttpResponseError

from dagster_streamgroup.protocol.state import STATE_KIND
from dagster_streamgroup.streams.base import (
    CommitRejectedError,
    ForeignGroupError,
    MirroredOffset,
    OffsetOutOfRangeError,
    RangeIncompleteError,
    StreamError,
    StreamListing,
    Watermarks,
)
from dagster_streamgroup.streams.v3io_config import (
    CONTAINER_NOT_FOUND,
    V3ioStreamConfig,
    check_group,
    missing_container,
)

V3IO_ARROW_SCHEMA = pa.schema(
    [
        pa.field("shard", pa.int32(), nullable=False),
        pa.field("sequence_number", pa.int64(), nullable=False),
        pa.field("data", pa.binary(), nullable=False),
        pa.field("arrival_time", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("partition_key", pa.string()),
        pa.field("client_info", pa.binary()),
    ]
)
"""One row per record; ``arrival_time`` is the platform's ingestion time (microseconds, as Spark keeps it)."""

FIRST_SEQUENCE = 1
MAX_RECORDS_PER_REQUEST = 10_000
NEVER = v3io.dataplane.RaiseForStatus.never
_CONDITION_FALSE = "16777244"


IDENTITY_ATTRIBUTE = "__streamgroup_log_id"
"""The identity of a shard's log: a random id the first member to list the shard writes on its object, once
(conditional on its absence). A stream deleted and created again at its path has new shard objects without it,
so they get new ones: the offsets the group holds count in a log that is gone (``protocol.lifecycle``). v3io
exposes no creation time it promises to keep (``__ctime_*`` may be POSIX change time), so the marker is ours.
Group-neutral: every group of the stream reads the same identity."""

STATE_ATTRIBUTE = "state"
"""Where v3io-go keeps a group's state in its state item (and our v3io store keeps ours)."""
STATE_KIND_ATTRIBUTE = "state_kind"
"""Marks the state items our v3io store writes (``stores/v3io.py``)."""


def group_state_item(group: str) -> str:
    """The item v3io-go keeps a group's state in, beside the stream's shards (``getStateFilePath``)."""
    return f"{check_group(group)}-state.json"


def group_marker_item(group: str) -> str:
    """The item, beside the shards, that says the group has positioned this stream (``V3ioBackend.group_offsets``).
    A shard without records has no object to hold the committed attribute, so without it a group whose state was
    lost could not tell a shard it had positioned at its start from a stream it never consumed."""
    return f"{check_group(group)}-streamgroup-positioned"


POSITIONED_ATTRIBUTE = "positioned_at"


def committed_attribute(group: str) -> str:
    """The shard attribute v3io-go/Nuclio keep a group's last processed sequence number in."""
    return f"__{check_group(group)}_committed_sequence_number"


def mirror_attribute(group: str) -> str:
    """Beside ``committed_attribute``: the value the group's members last wrote there. The committed attribute
    holding anything else was set by something else (Nuclio's way to replay a group: the attribute set on a
    shard), which a member tick refuses visibly and restores, as a reset made with Kafka's tool."""
    return f"__{check_group(group)}_streamgroup_mirrored"


def parse_shard(shard: str) -> int:
    """``"3"`` -> 3: v3io shard ids are the shard numbers."""
    if not isinstance(shard, str) or not shard.isdigit() or (len(shard) > 1 and shard[0] == "0"):
        raise ValueError(f"shard {shard!r} is not a v3io shard id ('0', '1', ...)")
    return int(shard)


def records_to_batch(shard: int, records: Sequence[Any]) -> pa.RecordBatch:
    """Arrow columns from the client's ``GetRecordsResult`` objects (data and client info already decoded)."""
    n = len(records)
    return pa.RecordBatch.from_arrays(
        [
            pa.repeat(pa.scalar(shard, pa.int32()), n),
            pa.array([r.sequence_number for r in records], pa.int64()),
            pa.array([r.data for r in records], pa.binary()),
            pa.array(
                [r.arrival_time_sec * 1_000_000 + r.arrival_time_nsec // 1000 for r in records],
                pa.timestamp("us", tz="UTC"),
            ),
            pa.array([r.partition_key for r in records], pa.string()),
            pa.array([r.client_info for r in records], pa.binary()),
        ],
        schema=V3IO_ARROW_SCHEMA,
    )


def _body(response: Any) -> str:
    body = response.body
    if isinstance(body, bytes):
        return body.decode("utf-8", "replace")
    return str(body or "")


class V3ioStream:
    """The v3io requests the backend and the Spark source make, each answering in our terms.

    Every request is sent with ``raise_for_status=never`` and its status interpreted here, so a platform
    error becomes a ``StreamError`` that names the stream, the shard and what was being done."""

    def __init__(self, config: V3ioStreamConfig, *, max_connections: int = 4) -> None:
        self.config = config
        self.container = config.container
        self.path = config.stream_path
        try:
            kwargs = config.client_kwargs()
        except ValueError as exc:
            raise StreamError(f"{config.stream_id}: {exc}") from None
        self.client = v3io.dataplane.Client(**kwargs, max_connections=max_connections)

    def _call(self, what: str, request: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return request(*args, raise_for_status=NEVER, **kwargs)
        except (OSError, HttpResponseError, RuntimeError) as exc:
            raise StreamError(f"{self.config.stream_id}: {what} failed: {exc}") from exc

    def _fail(self, what: str, response: Any) -> StreamError:
        if missing_container(response):
            return StreamError(
                f"{self.config.stream_id}: the container {self.container!r} does not exist (the platform answered "
                f"{what} with '{CONTAINER_NOT_FOUND}'); check the resource's container"
            )
        return StreamError(
            f"{self.config.stream_id}: {what} failed with status {response.status_code}: {_body(response)[:500]}"
        )

    def shard_count(self) -> int:
        response = self._call("DescribeStream", self.client.stream.describe, self.container, self.path)
        if missing_container(response):
            raise self._fail("DescribeStream", response)
        if response.status_code == 404:
            raise StreamError(f"{self.config.stream_id}: the stream does not exist (DescribeStream answered 404)")
        if response.status_code != 200:
            raise self._fail("DescribeStream", response)
        return int(response.output.shard_count)

    def shard_attributes(self, shard: int, names: Sequence[str]) -> dict[str, Any] | None:
        """The shard object's attributes, or None when the shard has no object yet (no record written)."""
        return self.item_attributes(str(shard), names, what=f"reading shard {shard}")

    def item_attributes(self, name: str, names: Sequence[str], *, what: str) -> dict[str, Any] | None:
        """Attributes of the item ``name`` in the stream's directory, or None when there is no such item."""
        response = self._call(what, self.client.kv.get, self.container, self.path, name, attribute_names=list(names))
        if response.status_code == 404 and not missing_container(response):
            return None
        if response.status_code != 200:
            raise self._fail(what, response)
        item: dict[str, Any] = response.output.item
        return item

    def shard_identity(self, shard: int) -> str | None:
        """The identity of the shard's log (``IDENTITY_ATTRIBUTE``), written now if the shard object has none yet;
        ``None`` when the shard has no object (no record written yet: nothing to count offsets in)."""
        for _ in range(3):
            item = self.shard_attributes(shard, [IDENTITY_ATTRIBUTE])
            if item is None:
                return None
            found = item.get(IDENTITY_ATTRIBUTE)
            if isinstance(found, str) and found:
                return found
            marker = uuid.uuid4().hex
            what = f"marking the log of shard {shard}"
            condition = f"(__obj_type == 3) AND (NOT exists({IDENTITY_ATTRIBUTE}))"
            response = self._call(
                what,
                self.client.kv.update,
                self.container,
                self.path,
                str(shard),
                attributes={IDENTITY_ATTRIBUTE: marker},
                condition=condition,
            )
            if response.status_code == 200:
                return marker
            if response.status_code != 400 or _CONDITION_FALSE not in _body(response):
                raise self._fail(what, response)
            # Another member marked it first, or the object went (the stream deleted): read again.
        raise StreamError(f"{self.config.stream_id}: shard {shard}: its log marker {IDENTITY_ATTRIBUTE} kept changing")

    def last_sequence(self, shard: int) -> int:
        """The last sequence number written to the shard (0 when none)."""
        item = self.shard_attributes(shard, ["__last_sequence_num"])
        if item is None:
            return FIRST_SEQUENCE - 1
        value = item.get("__last_sequence_num")
        if not isinstance(value, int):
            raise StreamError(f"{self.config.stream_id}: shard {shard} has no __last_sequence_num attribute")
        return value

    def seek(self, shard: int, seek_type: str, **kwargs: Any) -> str | None:
        """A location, or None when the shard has no records (404) or the sequence number is outside it (400)."""
        what = f"seeking shard {shard} ({seek_type})"
        response = self._call(what, self.client.stream.seek, self.container, self.path, shard, seek_type, **kwargs)
        if response.status_code == 200:
            location: str = response.output.location
            return location
        body = _body(response)
        if response.status_code in (400, 404) and "ResourceNotFound" in body:
            return None
        if response.status_code == 400 and "InvalidArgument" in body and seek_type == "SEQUENCE":
            return None
        raise self._fail(what, response)

    def get_records(self, shard: int, location: str, limit: int) -> Any | None:
        """The client's GetRecordsOutput, or None when the location is no longer valid (retention)."""
        what = f"reading shard {shard}"
        response = self._call(
            what, self.client.stream.get_records, self.container, self.path, shard, location, limit=limit
        )
        if response.status_code == 200:
            return response.output
        if response.status_code == 400 and "IllegalLocation" in _body(response):
            return None
        raise self._fail(what, response)

    def first_sequence_from(self, shard: int, location: str | None) -> int | None:
        """The sequence number of the first record at ``location``, None when there is none."""
        if location is None:
            return None
        out = self.get_records(shard, location, 1)
        if out is None or not out.records:
            return None
        first: int = out.records[0].sequence_number
        return first

    def watermarks(self, shard: int) -> Watermarks:
        last = self.last_sequence(shard)
        high = last + 1
        if last < FIRST_SEQUENCE:
            return Watermarks(high, high)
        first = self.first_sequence_from(shard, self.seek(shard, "EARLIEST"))
        return Watermarks(high if first is None else min(first, high), high)

    def close(self) -> None:
        self.client.close()


def read_shard_range(
    stream: V3ioStream,
    shard: int,
    start: int,
    end: int,
    *,
    batch_size: int = 10_000,
    records_per_request: int = 1000,
    stall_timeout_s: float = 30.0,
    poll_interval_s: float = 0.1,
) -> Iterator[pa.RecordBatch]:
    """Exactly the records with sequence numbers in ``[start, end)``, as batches of ``V3IO_ARROW_SCHEMA``.

    Seek SEQUENCE then GetRecords until ``end``. Records not written yet are waited for until
    ``stall_timeout_s`` passes without progress (``RangeIncompleteError``); records removed by retention
    raise ``OffsetOutOfRangeError``. Sequence numbers are contiguous, so any gap is a loss, never skipped."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if not 0 <= start <= end:
        raise ValueError(f"range of shard {shard}: need 0 <= start <= end, got [{start}, {end})")
    pos = max(start, FIRST_SEQUENCE)
    if pos >= end:
        return
    name = str(shard)
    last_progress = time.monotonic()
    location: str | None = None
    while pos < end:
        if location is None:
            location = stream.seek(shard, "SEQUENCE", starting_sequence_number=pos)
            if location is None:
                marks = stream.watermarks(shard)
                if pos < marks.low:
                    raise OffsetOutOfRangeError(name, pos, marks.low)
                _wait_or_give_up(name, start, end, pos, marks.high, last_progress, stall_timeout_s, poll_interval_s)
                continue
        limit = min(batch_size, end - pos, records_per_request, MAX_RECORDS_PER_REQUEST)
        out = stream.get_records(shard, location, limit)
        if out is None:
            raise OffsetOutOfRangeError(name, pos, stream.watermarks(shard).low)
        records = out.records
        if not records:
            location = out.next_location or location
            _wait_or_give_up(name, start, end, pos, pos, last_progress, stall_timeout_s, poll_interval_s)
            continue
        if records[0].sequence_number != pos:
            raise OffsetOutOfRangeError(name, pos, records[0].sequence_number)
        if records[-1].sequence_number >= end:
            records = [r for r in records if r.sequence_number < end]
        pos = records[-1].sequence_number + 1
        location = out.next_location
        last_progress = time.monotonic()
        yield records_to_batch(shard, records)


def _wait_or_give_up(
    shard: str,
    start: int,
    end: int,
    pos: int,
    high: int,
    last_progress: float,
    stall_timeout_s: float,
    poll_interval_s: float,
) -> None:
    waited = time.monotonic() - last_progress
    if waited > stall_timeout_s:
        raise RangeIncompleteError(
            f"shard {shard}: range [{start}, {end}) could not be completed: read up to {pos}, the shard ends at "
            f"{high} (its high watermark) and no record came for {waited:.1f} s. The range may have been planned "
            "past the data, or the stream is unreachable; nothing was committed."
        )
    time.sleep(poll_interval_s)


class V3ioBackend:
    """``StreamBackend`` over one v3io stream (see the module docstring for offsets and commits)."""

    def __init__(self, config: V3ioStreamConfig, *, stall_timeout_s: float = 30.0) -> None:
        self.config = config
        self.stall_timeout_s = stall_timeout_s
        self._stream: V3ioStream | None = None

    def __repr__(self) -> str:
        return f"V3ioBackend({self.stream_id!r})"

    @property
    def stream_id(self) -> str:
        return self.config.stream_id

    @property
    def legacy_stream_ids(self) -> list[str]:
        return []

    @property
    def arrow_schema(self) -> pa.Schema:
        return V3IO_ARROW_SCHEMA

    @property
    def stream(self) -> V3ioStream:
        if self._stream is None:
            self._stream = V3ioStream(self.config)
        return self._stream

    def shards(self) -> list[str]:
        return [str(i) for i in range(self.stream.shard_count())]

    def listing(self) -> StreamListing:
        """The shards and their logs' identities (``IDENTITY_ATTRIBUTE``; a shard with no record yet has none, and a
        stream created again before its first record is caught by its offsets, ``planning._offsets_ahead``, until
        one arrives); a missing stream is an error."""
        shards = self.shards()
        return StreamListing(shards=shards, identities=self.identities(shards), missing=frozenset())

    def identities(self, shards: Sequence[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for shard in shards:
            identity = self.stream.shard_identity(parse_shard(shard))
            if identity is not None:
                out[shard] = identity
        return out

    def _current(self, offsets: Mapping[str, int], identities: Mapping[str, str | None] | None) -> set[str]:
        """The shards of ``offsets`` whose log is still the one their offset counts in (``identities``; a shard
        without one is taken as current)."""
        named = {s: i for s, i in (identities or {}).items() if s in offsets and i is not None}
        if not named:
            return set(offsets)
        now = self.identities(list(named))
        return {s for s in offsets if s not in named or now.get(s) == named[s]}

    @property
    def watches_group_offsets(self) -> bool:
        """True: a replay set on the committed attribute (Nuclio's habit) must be seen on an idle shard too."""
        return True

    def group_offsets(self, group: str, shards: Sequence[str]) -> dict[str, MirroredOffset | None]:
        """The shard attributes, ``ours`` where ``mirror_attribute`` agrees (a v3io-go group of the same name is
        refused before anything is read).

        A shard without the attribute is at its first record for a group that has positioned the stream before
        (``group_marker_item``): it was empty then (no object to hold an offset), or added since (read from its
        start whatever the seek policy), so a state lost since resumes there rather than from the seek policy."""
        found = self._stored(group, shards)
        if any(o is None for o in found.values()) and self._positioned(group):
            first = MirroredOffset(FIRST_SEQUENCE, ours=True)
            found = {s: first if o is None else o for s, o in found.items()}
        return found

    def _positioned(self, group: str) -> bool:
        """Read each time, never cached: a stream deleted and created again loses the item with its shards."""
        name = group_marker_item(group)
        item = self.stream.item_attributes(name, [POSITIONED_ATTRIBUTE], what=f"reading the item {name}")
        return item is not None and POSITIONED_ATTRIBUTE in item

    def _mark_positioned(self, group: str) -> None:
        """Write ``group_marker_item`` once (the first commit of the group's offsets in this stream)."""
        if self._positioned(group):
            return
        name = group_marker_item(group)
        what = f"writing the item {name}"
        response = self.stream._call(
            what,
            self.stream.client.kv.update,
            self.config.container,
            self.config.stream_path,
            name,
            attributes={POSITIONED_ATTRIBUTE: int(time.time())},
            condition=f"NOT exists({POSITIONED_ATTRIBUTE})",
        )
        if response.status_code != 200 and (response.status_code != 400 or _CONDITION_FALSE not in _body(response)):
            raise self.stream._fail(what, response)

    def watermarks(self, shards: Sequence[str]) -> dict[str, Watermarks]:
        return {shard: self.stream.watermarks(parse_shard(shard)) for shard in shards}

    def check_group_is_ours(self, group: str, *, before: str = "using it") -> None:
        """Refuse a consumer group that v3io-go/Nuclio consumers (or anything not ours) keep next to this stream.

        v3io-go keeps a group's state in the item ``<group>-state.json`` beside the shards and its progress in
        the shards' ``__<group>_committed_sequence_number`` attributes, the ones our offsets are mirrored to.
        Whatever store holds our own state, a same-named group of theirs must never have those attributes
        read as ours or pushed forward. Our own state item (``store_url="v3io"``) carries ``state_kind``."""
        name = group_state_item(group)
        what = f"reading the state item {name} of group {group!r} before {before}"
        marked = self.stream.item_attributes(name, [STATE_KIND_ATTRIBUTE], what=what)
        if marked is None or marked.get(STATE_KIND_ATTRIBUTE) == STATE_KIND:
            return
        item = self.stream.item_attributes(name, [STATE_ATTRIBUTE], what=what)
        text = None if item is None else item.get(STATE_ATTRIBUTE)
        if not isinstance(text, str):
            return  # an item without a group state manages nothing
        where = f"{self.stream_id}: item {self.config.container}/{self.config.stream_path}/{name}"
        attribute = committed_attribute(group)
        try:
            raw = json.loads(text)
        except ValueError:
            raw = None
        if isinstance(raw, dict) and raw.get("kind") == STATE_KIND:
            return  # ours, written by a version that did not mark the item
        if isinstance(raw, dict) and "session_states" in raw:
            raise ForeignGroupError(
                f"{where}: consumer group {group!r} of this stream is managed by v3io-go/Nuclio consumers (this is "
                f"their group state); dagster-streamgroup will neither read nor move their {attribute} shard "
                "attributes, whatever store_url says. Use another group name, or stop those consumers and delete "
                "the item to hand the group over."
            )
        raise ForeignGroupError(
            f"{where}: the state item of consumer group {group!r} holds something that is not a dagster-streamgroup "
            f"group state; the group's {attribute} shard attributes may belong to another consumer, so they are "
            "neither read nor moved. If the group is ours and the item was overwritten, restore it from a backup, "
            "or delete it: the group then starts again from the offsets mirrored in those attributes. If another "
            "application owns the group, give ours another group name."
        )

    def committed(self, group: str, shards: Sequence[str]) -> dict[str, int | None]:
        return {s: None if m is None else m.offset for s, m in self._stored(group, shards).items()}

    def _stored(self, group: str, shards: Sequence[str]) -> dict[str, MirroredOffset | None]:
        """The committed attributes as offsets, each ``ours`` where ``mirror_attribute`` holds the same value."""
        self.check_group_is_ours(group, before="reading its committed offsets")
        attribute, mirror = committed_attribute(group), mirror_attribute(group)
        out: dict[str, MirroredOffset | None] = {}
        for shard in shards:
            item = self.stream.shard_attributes(parse_shard(shard), [attribute, mirror]) or {}
            value = item.get(attribute)
            out[shard] = None if value is None else MirroredOffset(int(value) + 1, ours=item.get(mirror) == value)
        return out

    def commit(
        self,
        group: str,
        offsets: Mapping[str, int],
        *,
        identities: Mapping[str, str | None] | None = None,
        refresh: bool = False,
        restore: bool = False,
    ) -> dict[str, int]:
        """Raise each shard's attribute to ``offset - 1`` unless it is already there or higher, or holds a value
        the members did not write (left for the next tick to refuse and restore); ``restore``: set it whatever it
        holds, backwards too (a member restoring the mirror, ``streamgroup reset``). An offset whose log identity
        (``identities``) is not the shard's now is not written: it counts in a stream that was deleted.
        ``refresh`` changes nothing here: an attribute does not expire.

        A shard with no records yet has no object to hold the attribute: a commit at its start
        (offset <= 1, nothing processed) is left out of the result; a larger one is refused."""
        attribute, mirror = committed_attribute(group), mirror_attribute(group)
        if offsets:
            self.check_group_is_ours(group, before=f"committing its offsets of shards {sorted(offsets)}")
        for shard, offset in offsets.items():
            parse_shard(shard)
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise ValueError(f"offset of shard {shard} must be an integer >= 0, got {offset!r}")
        current = self._current(offsets, identities)
        if current:
            self._mark_positioned(group)
        effective: dict[str, int] = {}
        for shard, offset in offsets.items():
            if shard not in current:
                continue
            number = parse_shard(shard)
            last_processed = max(offset - 1, FIRST_SEQUENCE - 1)
            condition = (
                f"(__obj_type == 3) AND ((NOT exists({attribute})) OR "
                f"(({attribute} < {last_processed}) AND ({attribute} == {mirror})))"
            )
            if restore:
                condition = "__obj_type == 3"
            what = f"committing shard {shard} for group {group!r}"
            response = self.stream._call(
                what,
                self.stream.client.kv.update,
                self.config.container,
                self.config.stream_path,
                shard,
                attributes={attribute: last_processed, mirror: last_processed},
                condition=condition,
            )
            if response.status_code == 200:
                effective[shard] = last_processed + 1
                continue
            if response.status_code != 400 or _CONDITION_FALSE not in _body(response):
                raise self.stream._fail(what, response)
            item = self.stream.shard_attributes(number, [attribute, mirror])
            if item is None:
                if offset <= FIRST_SEQUENCE:
                    continue
                raise CommitRejectedError(
                    f"{self.stream_id}: shard {shard} has no records yet, so offset {offset} of group {group!r} "
                    "is past its end; nothing was written"
                )
            stored = item.get(attribute)
            if not isinstance(stored, int):
                raise StreamError(f"{self.stream_id}: shard {shard}: {attribute} holds {stored!r}, not a number")
            foreign = item.get(mirror) != stored
            effective[shard] = (stored if foreign else max(stored, last_processed)) + 1
        return effective

    def keep_alive(
        self, group: str, offsets: Mapping[str, int], identities: Mapping[str, str | None] | None = None
    ) -> None:
        """Nothing to do: a shard attribute does not expire."""

    def check_group(self, group: str) -> None:
        self.check_group_is_ours(group, before="a member tick")

    def offset_for_time(self, shard: str, timestamp_ms: int) -> int:
        number = parse_shard(shard)
        seconds, millis = divmod(max(timestamp_ms, 0), 1000)
        location = self.stream.seek(number, "TIME", timestamp_sec=seconds, timestamp_nsec=millis * 1_000_000)
        first = self.stream.first_sequence_from(number, location)
        if first is not None:
            return first
        return self.stream.last_sequence(number) + 1

    def record_times(self, offsets: Mapping[str, int]) -> dict[str, int | None]:
        """The arrival time the platform stamped on the record at each sequence number: a seek and a one-record
        GetRecords per shard (v3io has no request over several shards). A sequence number below retention reads
        the earliest record still held."""
        out: dict[str, int | None] = {}
        for shard, offset in offsets.items():
            number = parse_shard(shard)
            location = self.stream.seek(number, "SEQUENCE", starting_sequence_number=max(offset, FIRST_SEQUENCE))
            if location is None:
                location = self.stream.seek(number, "EARLIEST")
            found = self.stream.get_records(number, location, 1) if location is not None else None
            records = found.records if found is not None else []
            first = records[0] if records else None
            out[shard] = None if first is None else first.arrival_time_sec * 1000 + first.arrival_time_nsec // 1_000_000
        return out

    def read_range(self, shard: str, start: int, end: int, *, batch_size: int = 10_000) -> Iterator[pa.RecordBatch]:
        return read_shard_range(
            self.stream,
            parse_shard(shard),
            start,
            end,
            batch_size=batch_size,
            records_per_request=self.config.records_per_request,
            stall_timeout_s=self.stall_timeout_s,
        )

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None
