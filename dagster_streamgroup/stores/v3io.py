"""The v3io state store: the group state as a KV item next to the stream, compare-and-set on its mtime.

Where: ``<stream path>/<group>-state.json`` in the stream's container, the item v3io-go uses for its own
consumer groups (a key whose stream is not a v3io stream id goes under ``<directory>/<stream>/`` of the
store's container). How: read the item with its ``__mtime_secs``/``__mtime_nsecs``, write it back under
``(__mtime_secs == S) AND (__mtime_nsecs == N)``, and create it under ``not(exists(state))``, exactly as
v3io-go does; the token handed out is the mtime pair.

The encoded state goes into the attribute ``state`` (v3io-go's) and, when it is longer than one string
attribute may be (the v3io client refuses more than 61,199 characters), continues in ``state_1``,
``state_2``, ... with the count in ``state_parts``: one item, so one conditional write still covers the
whole state. States larger than one attribute are zlib-compressed first (5,000 shards: 1.7-1.9 MB of JSON
become about 110-120 kB), which also keeps each tick's read and write small.

Our items also carry ``state_kind`` and ``state_schema``, and every update requires them to be ours and
not newer: a v3io-go/Nuclio group (a ``session_states`` document in ``state``) or a state of a newer
version is refused with the codec's error and never overwritten, even by a caller holding its mtime.

The clock is the platform's: ``now()`` writes a small clock item and reads the mtime the platform gave that
write from the ``X-v3io-transaction-verifier`` response header, so members on different hosts compare
heartbeats on one clock, the same clock that stamps the state item.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import zlib
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import v3io.dataplane
from pydantic import ValidationError
from v3io.dataplane.response import HttpResponseError

from dagster_streamgroup.protocol.codec import ForeignStateError, decode_state, encode_state
from dagster_streamgroup.protocol.state import SCHEMA_VERSION, STATE_KIND, GroupState
from dagster_streamgroup.stores.base import StateToken, StoreConfigError, StoreUnavailableError
from dagster_streamgroup.streams.v3io_config import V3ioConnection, normalise_path, parse_stream_id

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
ENCODING_JSON = "json"
ENCODING_ZLIB = "zlib+base64"
NEVER = v3io.dataplane.RaiseForStatus.never

_CONDITION_FALSE = "16777244"
_VERIFIER = re.compile(r"__mtime_secs\s*==\s*(\d+)\s+and\s+__mtime_nsecs\s*==\s*(\d+)", re.IGNORECASE)
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9._-]{1,200}$")
_NS = 1_000_000_000


def split_parts(text: str, size: int = PART_CHARS) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def encode_attributes(body: str, *, compress: bool = True) -> dict[str, Any]:
    """The item attributes holding ``body``: plain JSON when it fits one attribute, else compressed parts."""
    encoding = ENCODING_JSON
    if compress and len(body) > PART_CHARS:
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


def parse_token(token: StateToken) -> tuple[int, int] | None:
    """``"S:N"`` -> (S, N); None for anything this store did not issue."""
    secs, sep, nsecs = str(token).partition(":")
    if not sep or not secs.isdigit() or not nsecs.isdigit():
        return None
    return int(secs), int(nsecs)


def state_location(key: str, container: str, directory: str) -> tuple[str, str, str]:
    """(container, directory, item name) of the state stored under ``key`` (``"<stream id>|<group>"``)."""
    stream, sep, group = key.rpartition("|")
    if not sep or not stream or not group:
        raise StoreConfigError(f"state key {key!r} is not '<stream>|<group>'")
    item = f"{group}-state.json"
    if not _PLAIN_NAME.match(item):
        raise StoreConfigError(f"state key {key!r}: group {group!r} cannot name a v3io item ([A-Za-z0-9._-])")
    parsed = parse_stream_id(stream)
    if parsed is not None:
        return parsed[0], parsed[1], item
    if _PLAIN_NAME.match(stream) and stream not in {".", ".."}:
        name = stream
    else:
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", stream).strip("._")[:80]
        name = f"{slug}-{hashlib.sha256(stream.encode()).hexdigest()[:12]}"
    return container, f"{directory}/{name}", item


class V3ioStateStore:
    """A ``StateStore`` over v3io KV items (see the module docstring)."""

    def __init__(
        self, connection: V3ioConnection, *, directory: str = DEFAULT_DIRECTORY, compress: bool = True
    ) -> None:
        self.connection = connection
        self.directory = normalise_path(directory, what="directory")
        self.compress = compress
        self._name = f"v3io://{urlsplit(connection.endpoint).netloc}/{connection.container}/{self.directory}"
        try:
            kwargs = connection.client_kwargs()
        except ValueError as exc:
            raise StoreConfigError(f"state store {self._name}: {exc}") from None
        self._client = v3io.dataplane.Client(**kwargs, max_connections=2)

    @classmethod
    def from_url(cls, url: str) -> V3ioStateStore:
        """``v3io://HOST[:PORT]/CONTAINER[/DIRECTORY][?https=true&access_key_file=PATH]``.

        The access key comes from ``access_key_file`` or ``$V3IO_ACCESS_KEY``, never from the URL."""
        connection, directory, compress = parse_store_url(url)
        return cls(connection, directory=directory, compress=compress)

    def __repr__(self) -> str:
        return f"V3ioStateStore({self._name!r})"

    @property
    def url(self) -> str:
        return self._name

    def _where(self, key: str, location: tuple[str, str, str]) -> str:
        container, directory, item = location
        return f"{self._name} key {key!r} (item {container}/{directory}/{item})"

    def _call(self, what: str, method: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, raise_for_status=NEVER, **kwargs)
        except (OSError, HttpResponseError, RuntimeError) as exc:
            raise StoreUnavailableError(f"state store {self._name}: cannot {what}: {exc}") from exc

    def _unexpected(self, what: str, response: Any) -> StoreUnavailableError:
        body = response.body.decode("utf-8", "replace") if isinstance(response.body, bytes) else str(response.body)
        return StoreUnavailableError(
            f"state store {self._name}: cannot {what}: status {response.status_code}: {body[:300]}"
        )

    def _get(self, key: str, location: tuple[str, str, str], names: list[str]) -> dict[str, Any] | None:
        container, directory, item = location
        response = self._call(f"load {key!r}", self._client.kv.get, container, directory, item, attribute_names=names)
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise self._unexpected(f"load {key!r}", response)
        found: dict[str, Any] = response.output.item
        return found

    def load(self, key: str) -> tuple[GroupState | None, StateToken | None]:
        location = state_location(key, self.connection.container, self.directory)
        item = self._get(key, location, ["**"])
        if item is None or STATE not in item:
            return None, None
        where = self._where(key, location)
        state = decode_state(decode_attributes(item, where=where), where=where)
        return state, f"{item['__mtime_secs']}:{item['__mtime_nsecs']}"

    def save_if(self, key: str, state: GroupState, token: StateToken | None) -> bool:
        location = state_location(key, self.connection.container, self.directory)
        container, directory, item = location
        attributes = encode_attributes(encode_state(state), compress=self.compress)
        if token is None:
            condition, mode = f"not(exists({STATE}))", None
            mtime = None
        else:
            mtime = parse_token(token)
            if mtime is None:
                return False  # not a version this store issued, so not the stored one
            condition = (
                f"(__mtime_secs == {mtime[0]}) AND (__mtime_nsecs == {mtime[1]}) "
                f"AND ({KIND} == '{STATE_KIND}') AND ({SCHEMA} <= {SCHEMA_VERSION})"
            )
            # Replace the item, so parts of a longer earlier state do not linger.
            mode = "OverWriteAttributes"
        response = self._call(
            f"save {key!r}",
            self._client.kv.update,
            container,
            directory,
            item,
            attributes=attributes,
            condition=condition,
            update_mode=mode,
        )
        if response.status_code == 200:
            return True
        body = response.body.decode("utf-8", "replace") if isinstance(response.body, bytes) else ""
        if response.status_code != 400 or _CONDITION_FALSE not in body:
            raise self._unexpected(f"save {key!r}", response)
        if mtime is None:
            return False
        current = self._get(key, location, ["__mtime_secs", "__mtime_nsecs"])
        if current is None or (current.get("__mtime_secs"), current.get("__mtime_nsecs")) != mtime:
            return False
        # The mtime matched, so the item was refused for what it holds: say why instead of reporting a
        # conflict that the caller would retry forever.
        self.load(key)
        raise ForeignStateError(
            f"{self._where(key, location)}: the item is not marked as a dagster-streamgroup state of schema "
            f"<= {SCHEMA_VERSION}; refusing to overwrite it"
        )

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

    def close(self) -> None:
        self._client.close()


def _port_ok(parts: Any) -> bool:
    try:
        return parts.port is not None
    except ValueError:
        return False


def parse_store_url(url: str) -> tuple[V3ioConnection, str, bool]:
    """The connection, state directory and compression a ``v3io://`` store URL names, checked without I/O."""
    parts = urlsplit(url)
    shown = f"v3io://{parts.hostname or ''}{f':{parts.port}' if _port_ok(parts) else ''}{parts.path}"
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
        raise StoreConfigError(f"{shown}: unknown option(s) {unknown}; known: https, access_key_file, compress")
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
    directory = "/".join(path[1:]) or DEFAULT_DIRECTORY
    compress = flags["compress"] if "compress" in options else True
    return connection, directory, compress
