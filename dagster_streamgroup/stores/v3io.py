"""The v3io state store: the group state as KV items next to the stream, each write appending what it changed.

Where: ``<stream path>/<group>-state.json`` in the stream's container, the item v3io-go uses for its own
consumer groups, unless the store names a directory (``v3io://HOST/CONTAINER/DIRECTORY``): then, as for a key
whose stream is not a v3io stream id, under ``<directory>/<stream>/`` of the store's container. Deleting a stream
deletes every item of its directory, so only a state kept in a directory of its own outlives a stream that is
deleted and created again (and can tell the new stream from the old one).

How (the design of ``stores/sql_log.py`` on v3io KV; names and ranges in ``stores/v3io_log.py``): the base item
holds the whole state at ``state_version``, of a random ``state_lineage``; the head item beside it names the
newest version and the write that holds it (``state_head``, ``state_head_id``). A write from version ``v`` first
creates its log item ``<group>-state.json.log-<lineage>.<v + 1>.<write id>``, holding the ``StateDelta`` from
``v`` (or the whole state when no delta joins them) and the write id of ``v``, then moves the head item from
``v`` to ``v + 1`` under the condition ``state_head == v``: that conditional update is the compare-and-set, so of
two writers that loaded ``v`` one moves the head and the other is refused (and deletes its log item). Before
that the writer reads the base item's small guard attributes and refuses to build on one that is not ours, of a
newer schema, or of another lineage. Once the log items written since the last fold weigh twice the encoded base
item, the writer folds: it rewrites the base item at its version, under the base item's mtime (as v3io-go
conditions its writes), and deletes the log items the previous base item already held. A reader reads the base
item (or, while its mtime is unchanged, keeps the state it saw last), then the head item, then the log items up
to the head: one GetItems range scan of the base item's sharding key, followed from the head down by the write
ids.

Why the head item, and not the creation of log item ``v + 1`` only if absent (the earlier layout): v3io conditions
a write on the item it writes, and folds delete log items. A writer that loaded ``v`` and paused while others
folded twice would find item ``v + 1`` gone and create it: a write reported as done that no reader sees. Reading
the base item again after the create cannot tell that apart from a write another member read and folded in
meanwhile. The head item is never deleted by a fold, so its condition holds only for a writer that loaded the
newest version. A paused reader is safe the same way: it follows write ids from the head, so an item written by a
writer that lost the head is never read.

A base item written whole by an earlier version (no ``state_version``) is replaced whole, under its mtime, by
one with a log before anything is logged: a member of an earlier schema then refuses it. A base item of the
earlier log layout (a lineage of 12 hex digits, no head item) is read as that layout reads it; the first write
closes its log with a tombstone log item at the next version (a member of that layout cannot append after it,
and refuses to read it), then replaces the base item in a new lineage, only while it is still of the earlier
lineage and not past the version the writer loaded. A member of that layout cannot write to the new lineage: its
tokens do not parse one.

The encoded state goes into the attribute ``state`` (v3io-go's) and, when it is longer than one string
attribute may be (the v3io client refuses more than 61,199 characters), continues in ``state_1``,
``state_2``, ... with the count in ``state_parts``: one item, so one conditional write still covers the
whole state. States larger than one attribute are zlib-compressed first (5,000 shards: 1.7-1.9 MB of JSON
become about 110-120 kB), and so are log items longer than ``LOG_COMPRESS_ABOVE``.

Our items also carry ``state_kind`` and ``state_schema``, and every write of the base item requires them to be
ours and not newer: a v3io-go/Nuclio group (a ``session_states`` document in ``state``) or a state of a newer
version is refused with the codec's error and never overwritten, even by a caller holding its mtime.

The clock is the platform's: ``now()`` writes a small clock item and reads the mtime the platform gave that
write from the ``X-v3io-transaction-verifier`` response header, so members on different hosts compare
heartbeats on one clock, the same clock that stamps the state item.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import json
import re
import threading
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import v3io.dataplane
from pydantic import ValidationError
from v3io.dataplane.response import HttpResponseError

from dagster_streamgroup.protocol import delta
from dagster_streamgroup.protocol.codec import (
    ForeignStateError,
    NewerSchemaError,
    StateFormatError,
    decode_state,
    encode_state,
)
from dagster_streamgroup.protocol.state import SCHEMA_VERSION, STATE_KIND, GroupState
from dagster_streamgroup.redact import MASK, redact
from dagster_streamgroup.stores.base import (
    StateDamagedError,
    StateToken,
    StoreConfigError,
    StoreUnavailableError,
    reason,
)
from dagster_streamgroup.stores.ranges import CommittedRange
from dagster_streamgroup.stores.v3io_log import (
    LINEAGE,
    LOG_MARK,
    VERSION,
    KeyRange,
    LogToken,
    MtimeToken,
    every_lineage_range,
    head_item,
    is_legacy,
    is_lineage,
    log_item,
    log_range,
    new_lineage,
    new_write_id,
    parse_log_item,
    parse_token,
    should_fold,
)
from dagster_streamgroup.stores.v3io_ranges import V3ioRangeIndex
from dagster_streamgroup.streams.v3io_config import (
    CONTAINER_NOT_FOUND,
    V3ioConnection,
    missing_container,
    normalise_path,
    parse_stream_id,
)

PART_CHARS = 60_000
"""Characters per string attribute, below the v3io client's limit of 61,199."""
MAX_PARTS = 1000
DEFAULT_DIRECTORY = "streamgroup"
CLOCK_ITEM = "clock"
STATE = "state"
PARTS = "state_parts"
ENCODING = "state_encoding"
KIND = "state_kind"
SCHEMA = "state_schema"
PREVIOUS = "state_previous"
"""Attribute of a log item: the write id of the version it follows."""
HEAD = "state_head"
"""Attribute of the head item: the newest version ..."""
HEAD_ID = "state_head_id"
"""... and the write id of the log item that holds it."""
ENCODING_JSON = "json"
ENCODING_ZLIB = "zlib+base64"
NEVER = v3io.dataplane.RaiseForStatus.never
TOMBSTONE = '{"sealed":true}'
"""The body of the log item that closes a lineage of the earlier layout."""

LOG_COMPRESS_ABOVE = 2_000
"""Log items longer than this are compressed (a heartbeat's delta is a few hundred characters and stays JSON)."""
MAX_GAP_RETRIES = 3

_CONDITION_FALSE = "16777244"
_VERIFIER = re.compile(r"__mtime_secs\s*==\s*(\d+)\s+and\s+__mtime_nsecs\s*==\s*(\d+)", re.IGNORECASE)
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9._-]{1,200}$")
_NS = 1_000_000_000


def split_parts(text: str, size: int = PART_CHARS) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def encode_attributes(body: str, *, compress: bool = True, compress_above: int = PART_CHARS) -> dict[str, Any]:
    """The item attributes holding ``body``: plain JSON when it fits one attribute (or is at most
    ``compress_above`` characters), else compressed, in parts."""
    encoding = ENCODING_JSON
    if compress and len(body) > compress_above:
        body = base64.b64encode(zlib.compress(body.encode("utf-8"), 6)).decode("ascii")
        encoding = ENCODING_ZLIB
    parts = split_parts(body)
    if len(parts) > MAX_PARTS:
        raise ValueError(f"the encoded state needs {len(parts)} attributes, more than {MAX_PARTS}")
    attributes: dict[str, Any] = {STATE: parts[0]}
    for i, part in enumerate(parts[1:], start=1):
        attributes[f"{STATE}_{i}"] = part
    attributes.update({PARTS: len(parts), ENCODING: encoding, KIND: STATE_KIND, SCHEMA: SCHEMA_VERSION})
    return attributes


def decode_attributes(item: dict[str, Any], *, where: str) -> str:
    """Reassemble what ``encode_attributes`` wrote; a foreign item is just its ``state`` attribute."""
    count = item.get(PARTS, 1)
    if not isinstance(count, int) or not 1 <= count <= MAX_PARTS:
        raise ForeignStateError(f"{where}: {PARTS} is {count!r}, not a part count; refusing to overwrite it")
    parts = []
    for i in range(count):
        name = STATE if i == 0 else f"{STATE}_{i}"
        part = item.get(name)
        if not isinstance(part, str):
            raise ForeignStateError(f"{where}: attribute {name} of the {count}-part state is missing or not a string")
        parts.append(part)
    text = "".join(parts)
    encoding = item.get(ENCODING, ENCODING_JSON)
    if encoding == ENCODING_JSON:
        return text
    if encoding == ENCODING_ZLIB:
        try:
            return zlib.decompress(base64.b64decode(text, validate=True)).decode("utf-8")
        except (binascii.Error, zlib.error, UnicodeDecodeError) as exc:
            raise ForeignStateError(f"{where}: the compressed state cannot be decoded ({exc})") from exc
    raise ForeignStateError(f"{where}: unknown {ENCODING} {encoding!r}; refusing to overwrite it")


def state_location(key: str, container: str, directory: str, beside_streams: bool = True) -> tuple[str, str, str]:
    """(container, directory, item name) of the state stored under ``key`` (``"<stream id>|<group>"``): beside a
    v3io stream when ``beside_streams``, else (and for any other stream) under ``directory``."""
    stream, sep, group = key.rpartition("|")
    if not sep or not stream or not group:
        raise StoreConfigError(f"state key {key!r} is not '<stream>|<group>'")
    item = f"{group}-state.json"
    if not _PLAIN_NAME.match(item):
        raise StoreConfigError(f"state key {key!r}: group {group!r} cannot name a v3io item ([A-Za-z0-9._-])")
    parsed = parse_stream_id(stream) if beside_streams else None
    if parsed is not None:
        return parsed[0], parsed[1], item
    if _PLAIN_NAME.match(stream) and stream not in {".", ".."}:
        name = stream
    else:
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", stream).strip("._")[:80]
        name = f"{slug}-{hashlib.sha256(stream.encode()).hexdigest()[:12]}"
    return container, f"{directory}/{name}", item


@dataclass
@dataclass
class _Known:
    """What this store last saw of a key: the state at ``version`` (of ``lineage``, held by the log item of
    ``write_id``) and the base item it was built on. ``lineage`` is "" for a base item without a log, whose
    ``base_mtime`` is then its version; ``write_id`` is "" in a lineage of the earlier layout."""

    lineage: str
    version: int
    state: GroupState
    base_version: int
    base_mtime: tuple[int, int] | None
    appended_bytes: int
    """Bytes of the log items after the base item."""
    state_bytes: int
    """Bytes of the base item's encoded state."""
    write_id: str = ""

    @property
    def token(self) -> str:
        if not self.lineage:
            assert self.base_mtime is not None
            return str(MtimeToken(*self.base_mtime))
        return str(LogToken(self.lineage, self.version))


class _GapError(Exception):
    """What this reader got does not join up: log items folded meanwhile, or a base item replaced. Read again.

    ``missing`` names the item the reader looked for and did not find, and ``base`` the base item it read
    (lineage and mtime): the same item missing twice under an unchanged base item is not a fold but damage."""

    def __init__(self, missing: str = "", base: object = None) -> None:
        super().__init__(missing)
        self.missing = missing
        self.base = base


_GUARD = [KIND, SCHEMA, PARTS, VERSION, LINEAGE, "__mtime_secs", "__mtime_nsecs"]
"""What a reader or writer reads of the base item before anything else: small, whatever the state's size."""


def _mtime(item: dict[str, Any]) -> tuple[int, int] | None:
    secs, nsecs = item.get("__mtime_secs"), item.get("__mtime_nsecs")
    return (secs, nsecs) if isinstance(secs, int) and isinstance(nsecs, int) else None


def _logged(item: dict[str, Any]) -> bool:
    """A base item of ours with a log, of a schema this version may build on."""
    schema = item.get(SCHEMA)
    return (
        item.get(KIND) == STATE_KIND
        and isinstance(schema, int)
        and schema <= SCHEMA_VERSION
        and isinstance(item.get(VERSION), int)
        and is_lineage(item.get(LINEAGE))
    )


def _body_size(attributes: dict[str, Any]) -> int:
    """Characters of the encoded state or delta an item's attributes carry."""
    parts = attributes.get(PARTS, 1)
    names = [STATE] + [f"{STATE}_{i}" for i in range(1, parts if isinstance(parts, int) else 1)]
    return sum(len(v) for v in (attributes.get(name) for name in names) if isinstance(v, str))


def _holds(known: _Known | None, token: LogToken) -> bool:
    """Whether ``known`` is the state at ``token``, with the write id a write after it names."""
    if known is None or known.lineage != token.lineage or known.version != token.version:
        return False
    return bool(known.write_id) or is_legacy(known.lineage)


def _head_attributes(lineage: str, version: int, write_id: str, schema: int) -> dict[str, Any]:
    return {HEAD: version, HEAD_ID: write_id, LINEAGE: lineage, KIND: STATE_KIND, SCHEMA: schema}


class V3ioStateStore:
    """A ``StateStore`` over v3io KV items (see the module docstring).

    ``min_fold_bytes`` and ``fold_fraction`` set when this store folds (``None``: the settings of
    ``stores/v3io_log.py``); tests and ``bench.store_linearizability`` fold often to race writers against folds."""

    def __init__(
        self,
        connection: V3ioConnection,
        *,
        directory: str = DEFAULT_DIRECTORY,
        beside_streams: bool = True,
        compress: bool = True,
        min_fold_bytes: int | None = None,
        fold_fraction: float | None = None,
    ) -> None:
        self.connection = connection
        self.directory = normalise_path(directory, what="directory")
        self.beside_streams = beside_streams
        self.compress = compress
        self.min_fold_bytes = min_fold_bytes
        self.fold_fraction = fold_fraction
        self._name = f"v3io://{urlsplit(connection.endpoint).netloc}/{connection.container}/{self.directory}"
        try:
            kwargs = connection.client_kwargs()
        except ValueError as exc:
            raise StoreConfigError(f"state store {self._name}: {exc}") from None
        self._client = v3io.dataplane.Client(**kwargs, max_connections=2)
        self._known: dict[str, _Known] = {}
        self._lock = threading.Lock()
        self.bytes_written = 0
        """Characters of encoded states and deltas this store wrote (what its writes cost the platform)."""
        self.folds = 0
        """Folds this store wrote."""

    @classmethod
    def from_url(cls, url: str) -> V3ioStateStore:
        """``v3io://HOST[:PORT]/CONTAINER[/DIRECTORY][?https=true&access_key_file=PATH]``.

        The access key comes from ``access_key_file`` or ``$V3IO_ACCESS_KEY``, never from the URL."""
        connection, directory, compress = parse_store_url(url)
        return cls(
            connection, directory=directory or DEFAULT_DIRECTORY, beside_streams=directory is None, compress=compress
        )

    def __repr__(self) -> str:
        return f"V3ioStateStore({self._name!r})"

    @property
    def url(self) -> str:
        return self._name

    def should_fold(self, appended_bytes: int, state_bytes: int) -> bool:
        """Whether the log items after the base item (``appended_bytes``) are worth rewriting the state for."""
        return should_fold(appended_bytes, state_bytes, min_bytes=self.min_fold_bytes, fraction=self.fold_fraction)

    # -- requests -------------------------------------------------------------------------------------------

    def _where(self, key: str, location: tuple[str, str, str]) -> str:
        container, directory, item = location
        return f"{self._name} key {key!r} (item {container}/{directory}/{item})"

    def _damaged(self, key: str, location: tuple[str, str, str], what: str) -> StateDamagedError:
        """The error for a state with part of it deleted or overwritten: reading on would go back to an older
        state, so nothing is read or written until an operator restores the item or lets the state go."""
        container, directory, item = location
        return StateDamagedError(
            f"{self._where(key, location)}: {what}; reading on would roll the group back to an older state, so "
            f"the store is refusing to read or write it. Restore the item, or delete the state's items "
            f"({container}/{directory}/{item} and every {item}{LOG_MARK}* beside it): the group then starts "
            "again from the offsets mirrored in the stream's shard attributes, and ranges committed since the "
            "last mirror run again"
        )

    # -- requests -------------------------------------------------------------------------------------------

    def _call(self, what: str, method: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, raise_for_status=NEVER, **kwargs)
        except (OSError, HttpResponseError, RuntimeError) as exc:
            raise StoreUnavailableError(f"state store {self._name}: cannot {what}: {exc}") from exc

    def _unexpected(self, what: str, response: Any) -> StoreUnavailableError:
        body = response.body.decode("utf-8", "replace") if isinstance(response.body, bytes) else str(response.body)
        if missing_container(response):
            return StoreUnavailableError(
                f"state store {self._name}: cannot {what}: the container {self.connection.container!r} does not "
                f"exist (the platform answered '{CONTAINER_NOT_FOUND}'); check the store's container"
            )
        return StoreUnavailableError(
            f"state store {self._name}: cannot {what}: status {response.status_code}: {body[:300]}"
        )

    def _get(self, key: str, location: tuple[str, str, str], names: list[str]) -> dict[str, Any] | None:
        container, directory, item = location
        response = self._call(f"load {key!r}", self._client.kv.get, container, directory, item, attribute_names=names)
        if response.status_code == 404 and not missing_container(response):
            return None
        if response.status_code != 200:
            raise self._unexpected(f"load {key!r}", response)
        found: dict[str, Any] = response.output.item
        return found

    def _put(
        self, what: str, location: tuple[str, str, str], attributes: dict[str, Any], condition: str, mode: str | None
    ) -> tuple[bool, tuple[int, int] | None]:
        """A conditional write of one item: whether it was written (False: the condition was false) and the
        mtime the platform gave it (None when the response did not say)."""
        container, directory, item = location
        response = self._call(
            what, self._client.kv.update, container, directory, item,
            attributes=attributes, condition=condition, update_mode=mode,
        )  # fmt: skip
        if response.status_code == 200:
            header = response.headers.get("X-v3io-transaction-verifier") if response.headers is not None else None
            match = _VERIFIER.search(header or "")
            return True, (int(match.group(1)), int(match.group(2))) if match else None
        body = response.body.decode("utf-8", "replace") if isinstance(response.body, bytes) else ""
        if response.status_code == 400 and _CONDITION_FALSE in body:
            return False, None
        raise self._unexpected(what, response)

    def _scan(
        self, key: str, directory: tuple[str, str], key_range: KeyRange, names: list[str]
    ) -> list[dict[str, Any]]:
        """The items of a range scan, following the platform's markers."""
        container, path = directory
        items: list[dict[str, Any]] = []
        marker = None
        while True:
            response = self._call(
                f"read the log of {key!r}", self._client.kv.scan, container, path,
                attribute_names=names, marker=marker, sharding_key=key_range.sharding_key,
                sort_key_range_start=key_range.start, sort_key_range_end=key_range.end,
            )  # fmt: skip
            if response.status_code == 404 and not missing_container(response):
                return items
            if response.status_code != 200:
                raise self._unexpected(f"read the log of {key!r}", response)
            items.extend(response.output.items)
            marker = response.output.next_marker
            if response.output.last or not response.output.items or not marker:
                return items

    def _delete(self, key: str, location: tuple[str, str, str]) -> None:
        container, directory, item = location
        response = self._call(f"delete a log item of {key!r}", self._client.kv.delete, container, directory, item)
        if response.status_code not in (200, 204, 404) or missing_container(response):
            raise self._unexpected(f"delete a log item of {key!r}", response)

    # -- reading --------------------------------------------------------------------------------------------

    def load(self, key: str) -> tuple[GroupState | None, StateToken | None]:
        location = state_location(key, self.connection.container, self.directory, self.beside_streams)
        previous: _GapError | None = None
        for _ in range(MAX_GAP_RETRIES):
            with self._lock:
                names = _GUARD if key in self._known else ["**"]  # a store that holds nothing reads it all
            try:
                known = self._read(key, location, self._get(key, location, names))
            except _GapError as gap:
                with self._lock:
                    self._known.pop(key, None)
                if (
                    gap.missing
                    and previous is not None
                    and (gap.missing, gap.base) == (previous.missing, previous.base)
                ):
                    raise self._damaged(key, location, f"{gap.missing} is missing") from None
                previous = gap
                continue
            if known is None:
                return None, None
            return known.state, known.token
        if previous is not None and previous.missing:
            raise self._damaged(key, location, f"{previous.missing} is missing")
        raise StoreUnavailableError(
            f"state store {self._name}: cannot load {key!r}: its log was folded under every one of "
            f"{MAX_GAP_RETRIES} reads"
        )

    def _read(self, key: str, location: tuple[str, str, str], guard: dict[str, Any] | None) -> _Known | None:
        """The state as of now, from the base item (``guard`` is what was just read of it: its guard attributes,
        or all of it), the head item, and the log items up to the head."""
        if guard is None:
            with self._lock:
                self._known.pop(key, None)
            return None
        if not _logged(guard):
            return self._read_whole(key, location)
        if is_legacy(str(guard[LINEAGE])):
            return self._read_legacy(key, location)
        start = self._start(key, location, guard)
        head_version, head_id = self._head(key, location, start.lineage, start.base_version)
        known = self._follow(key, location, start, head_version, head_id)
        with self._lock:
            self._known[key] = known
        return known

    def _start(self, key: str, location: tuple[str, str, str], guard: dict[str, Any]) -> _Known:
        """The state to read the log from: the one this store holds while the base item is unchanged, or folded
        from versions it holds; else the base item's (a fold between the guard and this read is a gap)."""
        lineage, base_version, mtime = str(guard[LINEAGE]), int(guard[VERSION]), _mtime(guard)
        with self._lock:
            cached = self._known.get(key)
        if cached is not None and cached.lineage == lineage:
            if cached.base_mtime == mtime:
                return cached
            if cached.base_version < base_version <= cached.version:  # another member folded versions it holds
                return replace(cached, base_version=base_version, base_mtime=mtime, appended_bytes=0)
        item = guard if STATE in guard else self._get(key, location, ["**"])
        if item is None or not _logged(item) or item[LINEAGE] != lineage:
            raise _GapError()
        where = self._where(key, location)
        try:
            state = decode_state(decode_attributes(item, where=where), where=where)
        except NewerSchemaError:
            raise
        except StateFormatError as exc:  # marked as ours (``_logged``), yet unreadable: damaged, not foreign
            raise self._damaged(key, location, f"the base item cannot be read ({reason(exc)})") from exc
        version = int(item[VERSION])
        return _Known(lineage, version, state, version, _mtime(item), 0, _body_size(item))

    def _head(self, key: str, location: tuple[str, str, str], lineage: str, base_version: int) -> tuple[int, str]:
        """The newest version of ``lineage`` and the write id that holds it. A head item still missing (its
        creator stopped between the base item and it; nothing was logged without it) is created at the base
        item's version."""
        container, directory, item = location
        at = (container, directory, head_item(item, lineage))
        found = self._get(key, at, [HEAD, HEAD_ID])
        if found is None:
            self._check_head_never_written(key, location, lineage, base_version)
            first = _head_attributes(lineage, base_version, new_write_id(), SCHEMA_VERSION)
            self._put(f"save {key!r}", at, first, f"not(exists({HEAD}))", None)
            found = self._get(key, at, [HEAD, HEAD_ID])
        if found is None or not isinstance(found.get(HEAD), int) or not isinstance(found.get(HEAD_ID), str):
            raise self._damaged(key, location, f"the head item {at[2]} does not name a version")
        return found[HEAD], found[HEAD_ID]

    def _check_head_never_written(self, key: str, location: tuple[str, str, str], lineage: str, base: int) -> None:
        """A missing head item is created only where none ever was: its creator stopped between the base item
        and it, so the base is a lineage's first version and nothing was logged after it. Anywhere else it was
        deleted, and creating it again at the base item's version would roll back every logged write."""
        container, directory, item = location
        logged = [
            parsed
            for entry in self._scan(key, (container, directory), log_range(item, lineage, 0), ["__name"])
            if (parsed := parse_log_item(item, str(entry.get("__name", "")))) is not None and not parsed.is_head
        ]
        if base == 1 and not logged:
            return
        guard = self._get(key, location, [LINEAGE])
        if guard is None or guard.get(LINEAGE) != lineage:  # the state was replaced meanwhile: read it again
            raise _GapError()
        newest = max((p.version for p in logged), default=base)
        raise self._damaged(
            key, location,
            f"the head item {head_item(item, lineage)} is missing while the log holds versions up to {newest} "
            f"(the base item is at version {base})",
        )  # fmt: skip

    def _follow(
        self, key: str, location: tuple[str, str, str], start: _Known, head_version: int, head_id: str
    ) -> _Known:
        """``start`` with the log items up to the head applied: found from the head down by their write ids."""
        if head_version < start.version:
            raise _GapError()
        if head_version == start.version:
            if start.write_id and start.write_id != head_id:
                raise _GapError()
            return replace(start, write_id=head_id)
        state, appended = start.state, start.appended_bytes
        for entry in self._chain(key, location, start, head_version, head_id):
            state = self._applied(key, location, state, entry)
            appended += _body_size(entry)
        return replace(start, version=head_version, state=state, appended_bytes=appended, write_id=head_id)

    def _chain(
        self, key: str, location: tuple[str, str, str], start: _Known, head_version: int, head_id: str
    ) -> list[dict[str, Any]]:
        """The log items from ``start`` to the head, oldest first: the one of each version whose write id the
        next version names, from the head's down. Items of writers that lost the head are never among them."""
        container, directory, item = location
        found: dict[tuple[int, str], dict[str, Any]] = {}
        scan = log_range(item, start.lineage, start.version, through=head_version)
        for entry in self._scan(key, (container, directory), scan, ["**"]):
            name = parse_log_item(item, str(entry.get("__name", "")))
            if name is not None and name.lineage == start.lineage and not name.is_head:
                found[(name.version, name.write_id)] = entry
        chain: list[dict[str, Any]] = []
        write_id = head_id
        for version in range(head_version, start.version, -1):
            link = found.get((version, write_id))
            if link is None or not isinstance(link.get(PREVIOUS), str):  # folded meanwhile, or deleted
                raise _GapError(f"the log item {log_item(item, start.lineage, version, write_id)}", start.base_mtime)
            chain.append(link)
            write_id = link[PREVIOUS]
        if start.write_id and write_id != start.write_id:
            raise _GapError()
        return chain[::-1]

    def _read_legacy(self, key: str, location: tuple[str, str, str]) -> _Known:
        """A state of the earlier log layout: the base item, then each log item of the next version, up to a
        tombstone (the first write of this version closed the log there). Read whole each time: the first write
        moves it to this layout."""
        item = self._get(key, location, ["**"])
        if item is None or not _logged(item) or not is_legacy(str(item[LINEAGE])):
            raise _GapError()
        where = self._where(key, location)
        body = decode_attributes(item, where=where)
        state = decode_state(body, where=where)
        lineage, base_version = str(item[LINEAGE]), int(item[VERSION])
        version, appended = base_version, 0
        container, directory, name = location
        for entry in self._scan(key, (container, directory), log_range(name, lineage, version), ["**"]):
            parsed = parse_log_item(name, str(entry.get("__name", "")))
            if parsed is None or parsed.lineage != lineage or parsed.version <= version:
                continue
            if parsed.version != version + 1:
                raise _GapError()
            if entry.get(STATE) == TOMBSTONE:
                break
            state = self._applied(key, location, state, entry)
            version = parsed.version
            appended += _body_size(entry)
        known = _Known(lineage, version, state, base_version, _mtime(item), appended, _body_size(item))
        with self._lock:
            self._known[key] = known
        return known

    def _read_whole(self, key: str, location: tuple[str, str, str]) -> _Known | None:
        """A base item without a log (written whole by an earlier version), or one that is not ours: decoding
        it refuses what is foreign or newer."""
        item = self._get(key, location, ["**"])
        if item is None or STATE not in item:
            with self._lock:
                self._known.pop(key, None)
            return None
        where = self._where(key, location)
        state = decode_state(decode_attributes(item, where=where), where=where)
        if _logged(item):
            return self._read(key, location, item)
        known = _Known("", 0, state, 0, _mtime(item), 0, _body_size(item))
        with self._lock:
            self._known[key] = known
        return known

    def _applied(
        self, key: str, location: tuple[str, str, str], state: GroupState, entry: dict[str, Any]
    ) -> GroupState:
        where = f"{self._where(key, location)} log item {entry.get('__name')}"
        schema = entry.get(SCHEMA)
        if entry.get(KIND) != STATE_KIND or not isinstance(schema, int):
            raise ForeignStateError(f"{where}: not a dagster-streamgroup log item; refusing to write")
        if schema > SCHEMA_VERSION:
            raise NewerSchemaError(
                f"{where}: written by a newer dagster-streamgroup (schema {schema} > {SCHEMA_VERSION}); "
                "refusing to write"
            )
        try:
            raw = json.loads(decode_attributes(entry, where=where))
            if "state" in raw:
                return decode_state(json.dumps(raw["state"]), where=where)
            change = delta.StateDelta.model_validate(raw["delta"])
        except NewerSchemaError:
            raise
        except Exception as exc:  # damaged, or a field this version does not know
            raise self._damaged(key, location, f"the log item {entry.get('__name')} cannot be read ({exc})") from exc
        if state.revision != change.base_revision:
            raise _GapError()  # a change computed from another state than the one read so far
        return delta.apply(state, change)

    # -- writing --------------------------------------------------------------------------------------------

    def save_if(self, key: str, state: GroupState, token: StateToken | None) -> bool:
        location = state_location(key, self.connection.container, self.directory, self.beside_streams)
        if token is None:
            return self._create(key, location, state)
        parsed = parse_token(token)
        if parsed is None:
            return False  # not a version this store issued, so not the stored one
        if isinstance(parsed, MtimeToken):
            return self._replace_whole(key, location, state, parsed)
        return self._append(key, location, state, parsed)

    def _base_attributes(self, state: GroupState, lineage: str, version: int) -> dict[str, Any]:
        attributes = encode_attributes(encode_state(state), compress=self.compress)
        attributes.update({VERSION: version, LINEAGE: lineage})
        return attributes

    def _create(self, key: str, location: tuple[str, str, str], state: GroupState) -> bool:
        lineage = new_lineage()
        attributes = self._base_attributes(state, lineage, 1)
        written, mtime = self._put(f"save {key!r}", location, attributes, f"not(exists({STATE}))", None)
        if not written:
            return False
        self._started(key, location, _Known(lineage, 1, state, 1, mtime, 0, _body_size(attributes)), attributes)
        return True

    def _started(self, key: str, location: tuple[str, str, str], known: _Known, attributes: dict[str, Any]) -> None:
        """A base item of a new lineage was written (``attributes``): create its head item, and delete the log
        items of earlier lineages."""
        head_version, head_id = self._head(key, location, known.lineage, known.version)
        self._wrote(key, replace(known, write_id=head_id), attributes)
        if head_version != known.version:  # others wrote on since: what this store holds has no write id
            with self._lock:
                self._known.pop(key, None)
        self._drop_other_lineages(key, location, known.lineage)

    def _replace_whole(self, key: str, location: tuple[str, str, str], state: GroupState, token: MtimeToken) -> bool:
        """Replace a base item without a log, under its mtime (the guard of the version that wrote it), by
        one with a log: a member of that version then refuses the state, instead of replacing a base item the
        log has moved past."""
        lineage = new_lineage()
        attributes = self._base_attributes(state, lineage, 1)
        condition = (
            f"(__mtime_secs == {token.secs}) AND (__mtime_nsecs == {token.nsecs}) "
            f"AND ({KIND} == '{STATE_KIND}') AND ({SCHEMA} <= {SCHEMA_VERSION})"
        )
        written, mtime = self._put(f"save {key!r}", location, attributes, condition, "OverWriteAttributes")
        if written:
            self._started(key, location, _Known(lineage, 1, state, 1, mtime, 0, _body_size(attributes)), attributes)
            return True
        current = self._get(key, location, _GUARD)
        if current is None or _mtime(current) != (token.secs, token.nsecs) or _logged(current):
            return False
        # The mtime matched, so the item was refused for what it holds: say why instead of reporting a
        # conflict that the caller would retry forever.
        self._read_whole(key, location)
        raise ForeignStateError(
            f"{self._where(key, location)}: the item is not marked as a dagster-streamgroup state of schema "
            f"<= {SCHEMA_VERSION}; refusing to overwrite it"
        )

    def _append(self, key: str, location: tuple[str, str, str], state: GroupState, token: LogToken) -> bool:
        """Write version ``token.version + 1``: its log item, then the head item moved to it if it is still at
        ``token.version`` (the compare-and-set)."""
        guard = self._get(key, location, _GUARD)
        if guard is None:
            return False
        if not _logged(guard):
            self._read_whole(key, location)  # refuses what is foreign or newer
            return False  # a base item without a log: the token is not of it
        if guard[LINEAGE] != token.lineage:
            return False
        known = self._known_at(key, location, guard, token)
        if known is None:
            return False
        if is_legacy(token.lineage):
            return self._leave_legacy(key, location, state, known)
        rewrite = int(guard[SCHEMA]) < SCHEMA_VERSION  # an earlier schema: log the state whole, fold at once
        body = _whole_body(state) if rewrite else _log_body(known.state, state)
        attributes = encode_attributes(body, compress=self.compress, compress_above=LOG_COMPRESS_ABOVE)
        attributes.update({VERSION: token.version + 1, PREVIOUS: known.write_id})
        write_id = new_write_id()
        container, directory, item = location
        entry = (container, directory, log_item(item, token.lineage, token.version + 1, write_id))
        if not self._put(f"save {key!r}", entry, attributes, f"not(exists({STATE}))", None)[0]:
            return False
        if not self._advance_head(key, location, token, write_id, state.schema_version):
            self._delete(key, entry)  # no reader follows it; a later fold would delete it otherwise
            return False
        appended = known.appended_bytes + _body_size(attributes)
        after = replace(known, version=token.version + 1, state=state, appended_bytes=appended, write_id=write_id)
        self._wrote(key, after, attributes)
        if rewrite or self.should_fold(appended, known.state_bytes):
            self._fold(key, location, after)
        return True

    def _known_at(
        self, key: str, location: tuple[str, str, str], guard: dict[str, Any], token: LogToken
    ) -> _Known | None:
        """The state at ``token``, as this store holds it or reads it now; None when the state moved past it."""
        with self._lock:
            known = self._known.get(key)
        if not _holds(known, token):
            try:
                known = self._read(key, location, guard)
            except _GapError:
                return None
        return known if _holds(known, token) else None

    def _advance_head(
        self, key: str, location: tuple[str, str, str], token: LogToken, write_id: str, schema: int
    ) -> bool:
        container, directory, item = location
        at = (container, directory, head_item(item, token.lineage))
        condition = (
            f"({HEAD} == {token.version}) AND ({LINEAGE} == '{token.lineage}') "
            f"AND ({KIND} == '{STATE_KIND}') AND ({SCHEMA} <= {SCHEMA_VERSION})"
        )
        values = {HEAD: token.version + 1, HEAD_ID: write_id, SCHEMA: schema}
        return self._put(f"save {key!r}", at, values, condition, None)[0]

    def _leave_legacy(self, key: str, location: tuple[str, str, str], state: GroupState, known: _Known) -> bool:
        """Write ``state`` after ``known``, a state of the earlier layout, as the first version of a new lineage:
        close the earlier log with a tombstone at the next version (created only if absent, so a member of the
        earlier layout cannot append there any more), then replace the base item if it is still of the earlier
        lineage and not past ``known.version``. A base past it may have had that version's log item folded and
        deleted, so that the tombstone took the place of a write: then this write is refused."""
        container, directory, item = location
        seal = (container, directory, log_item(item, known.lineage, known.version + 1))
        closing = encode_attributes(TOMBSTONE, compress=False)
        closing[VERSION] = known.version + 1
        if not self._put(f"save {key!r}", seal, closing, f"not(exists({STATE}))", None)[0]:
            existing = self._get(key, seal, [STATE])
            if existing is None or existing.get(STATE) != TOMBSTONE:
                return False  # a member of the earlier layout wrote that version
        lineage = new_lineage()
        attributes = self._base_attributes(state, lineage, 1)
        condition = (
            f"({LINEAGE} == '{known.lineage}') AND ({VERSION} <= {known.version}) "
            f"AND ({KIND} == '{STATE_KIND}') AND ({SCHEMA} <= {SCHEMA_VERSION})"
        )
        written, mtime = self._put(f"save {key!r}", location, attributes, condition, "OverWriteAttributes")
        if not written:
            return False
        self._started(key, location, _Known(lineage, 1, state, 1, mtime, 0, _body_size(attributes)), attributes)
        return True

    def _fold(self, key: str, location: tuple[str, str, str], known: _Known) -> None:
        """Write the state at ``known.version`` as the base item, then delete the log items the previous base
        item already held. Conditional on the base item still being the one this writer built on, so of two
        members folding at once one writes; a fold that loses changes nothing."""
        if known.base_mtime is None:
            return
        attributes = self._base_attributes(known.state, known.lineage, known.version)
        secs, nsecs = known.base_mtime
        condition = (
            f"(__mtime_secs == {secs}) AND (__mtime_nsecs == {nsecs}) AND ({KIND} == '{STATE_KIND}') "
            f"AND ({SCHEMA} <= {SCHEMA_VERSION}) AND ({LINEAGE} == '{known.lineage}')"
        )
        written, mtime = self._put(f"fold the log of {key!r}", location, attributes, condition, "OverWriteAttributes")
        if not written:
            return
        self.folds += 1
        self._wrote(key, replace(known, base_version=known.version, base_mtime=mtime, appended_bytes=0,
                                 state_bytes=_body_size(attributes)), attributes)  # fmt: skip
        container, directory, item = location
        folded = log_range(item, known.lineage, 0, through=known.base_version)
        for entry in self._scan(key, (container, directory), folded, ["__name"]):
            name = str(entry.get("__name", ""))
            parsed = parse_log_item(item, name)
            if parsed is not None and parsed.lineage == known.lineage and 0 < parsed.version <= known.base_version:
                self._delete(key, (container, directory, name))

    def _drop_other_lineages(self, key: str, location: tuple[str, str, str], lineage: str) -> None:
        """Delete the log and head items left by earlier states of this key (deleted and created again, or of
        the earlier layout)."""
        container, directory, item = location
        for entry in self._scan(key, (container, directory), every_lineage_range(item), ["__name"]):
            name = str(entry.get("__name", ""))
            parsed = parse_log_item(item, name)
            if parsed is not None and parsed.lineage != lineage:
                self._delete(key, (container, directory, name))

    def _wrote(self, key: str, known: _Known, attributes: dict[str, Any]) -> None:
        self.bytes_written += _body_size(attributes)
        with self._lock:
            self._known[key] = known

    # -- clock ----------------------------------------------------------------------------------------------

    def now(self) -> float:
        directory = self.directory
        response = self._call(
            "read the platform clock", self._client.kv.update, self.connection.container, directory, CLOCK_ITEM,
            attributes={"touched": True},
        )  # fmt: skip
        if response.status_code != 200:
            raise self._unexpected("read the platform clock", response)
        header = response.headers.get("X-v3io-transaction-verifier") if response.headers is not None else None
        match = _VERIFIER.search(header or "")
        if match is not None:
            secs, nsecs = int(match.group(1)), int(match.group(2))
        else:
            location = (self.connection.container, directory, CLOCK_ITEM)
            item = self._get("clock", location, ["__mtime_secs", "__mtime_nsecs"])
            if item is None:
                raise StoreUnavailableError(f"state store {self._name}: the clock item vanished after its write")
            secs, nsecs = int(item["__mtime_secs"]), int(item["__mtime_nsecs"])
        return secs + nsecs / _NS

    # -- committed ranges -----------------------------------------------------------------------------------

    @functools.cached_property
    def _ranges(self) -> V3ioRangeIndex:
        def where(key: str) -> tuple[str, str]:
            container, directory, _ = state_location(
                key, self.connection.container, self.directory, self.beside_streams
            )
            return container, directory

        return V3ioRangeIndex(self._client, where, self._call, self._unexpected)

    def record_ranges(
        self, key: str, ranges: Sequence[CommittedRange], floors: Mapping[str, int] | None = None
    ) -> None:
        """The committed-range index (``stores/ranges.py``), items beside the state's (``stores/v3io_ranges.py``)."""
        self._ranges.record_ranges(key, ranges, floors)

    def ranges_between(self, key: str, shard: str, start: int, end: int) -> list[tuple[int, int]]:
        return self._ranges.ranges_between(key, shard, start, end)

    def close(self) -> None:
        self._client.close()


def _whole_body(state: GroupState) -> str:
    return '{"state":' + encode_state(state) + "}"


def _log_body(before: GroupState, after: GroupState) -> str:
    try:
        change = delta.diff(before, after)
    except ValueError:  # another group's state, or shards removed: no delta joins them
        return _whole_body(after)
    return '{"delta":' + delta.encode_delta(change) + "}"


_OPTION_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,40}")


def parse_store_url(url: str) -> tuple[V3ioConnection, str | None, bool]:
    """The connection, state directory (None: the URL names none) and compression a ``v3io://`` store URL names,
    checked without I/O."""
    parts = urlsplit(url)
    shown = redact(url)
    if parts.password or parts.username:
        raise StoreConfigError(
            f"{shown}: the access key must not be in the URL; use access_key_file=PATH or $V3IO_ACCESS_KEY"
        )
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    if "access_key" in options:
        raise StoreConfigError(
            f"{shown}: the access key must not be in the URL; use access_key_file=PATH or $V3IO_ACCESS_KEY"
        )
    unknown = sorted(set(options) - {"https", "access_key_file", "compress"})
    if unknown:
        named = [k if _OPTION_NAME.fullmatch(k) else MASK for k in unknown]  # a name may be a piece of a secret
        raise StoreConfigError(f"{shown}: unknown option(s) {named}; known: https, access_key_file, compress")
    flags = {}
    for name in ("https", "compress"):
        value = options.get(name, "")
        if value.lower() not in {"", "true", "false", "1", "0"}:
            raise StoreConfigError(f"{shown}: option {name} must be true or false, got {value!r}")
        flags[name] = value.lower() in {"true", "1"}
    path = [p for p in parts.path.split("/") if p]
    if not parts.hostname or not path:
        raise StoreConfigError(f"{shown}: expected v3io://HOST[:PORT]/CONTAINER[/DIRECTORY]")
    scheme = "https" if flags["https"] else "http"
    try:
        connection = V3ioConnection(
            endpoint=f"{scheme}://{parts.netloc}",
            container=path[0],
            access_key_file=Path(options["access_key_file"]) if options.get("access_key_file") else None,
        )
    except ValidationError as exc:
        detail = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'url'}: {e['msg']}"
            for e in exc.errors(include_input=False, include_url=False)
        )
        raise StoreConfigError(f"{shown}: {detail}") from None
    directory = "/".join(path[1:]) or None
    compress = flags["compress"] if "compress" in options else True
    return connection, directory, compress
