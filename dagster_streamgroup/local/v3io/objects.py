"""Requests without ``X-v3io-function``: simple objects (GET/PUT/POST/HEAD/DELETE), directories and
S3-style listings (``GET /<container>?prefix=...``, ``GET /`` for the containers).

Listings are one level deep with ``/`` as the delimiter, keys are container-relative without a leading
``/``, and ``Name``, ``NextMarker``, ``MaxKeys`` and ``IsTruncated`` are always present because the
Python client reads them unconditionally.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from email.utils import formatdate
from xml.sax.saxutils import escape

from dagster_streamgroup.local.v3io import errors, namespace, paths
from dagster_streamgroup.local.v3io.paths import Target
from dagster_streamgroup.local.v3io.protocol import Request, Response
from dagster_streamgroup.local.v3io.storage import KIND_DIRECTORY, KIND_SHARD, NodeRow, Storage

XML = "application/xml"
OCTET = "application/octet-stream"
DEFAULT_MAX_KEYS = 1000
MAX_MAX_KEYS = 10000
_RANGE_RE = re.compile(r"^bytes=(\d+)(?:-(\d*))?$")
_NS = 1_000_000_000


def _iso(ns: int) -> str:
    secs, rest = divmod(ns, _NS)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{rest // 1_000_000:03d}Z"


def _http_date(ns: int) -> str:
    return formatdate(ns / _NS, usegmt=True)


def list_containers(containers: Sequence[str], created_ns: int) -> Response:
    buckets = "".join(
        f"<Bucket><Name>{escape(name)}</Name><CreationDate>{_iso(created_ns)}</CreationDate>"
        f"<Id>{index + 1}</Id></Bucket>"
        for index, name in enumerate(containers)
    )
    xml = (
        '<?xml version="1.0" encoding="UTF-8"?>\n<ListAllMyBucketsResult><Owner><ID>0</ID>'
        f"<DisplayName>local</DisplayName></Owner><Buckets>{buckets}</Buckets></ListAllMyBucketsResult>"
    )
    return Response(200, xml.encode(), XML)


def _flag(request: Request, name: str) -> bool:
    return request.query.get(name, "").lower() in ("1", "true", "yes")


def list_directory(store: Storage, container: str, request: Request) -> Response:
    raw_prefix = request.query.get("prefix", "")
    prefix = paths.normalise(raw_prefix)
    info = _flag(request, "prefix-info")
    dirs_only = _flag(request, "prefix-only")
    try:
        max_keys = int(request.query.get("max-keys", DEFAULT_MAX_KEYS))
    except ValueError:
        raise errors.invalid("max-keys must be an integer") from None
    if not 1 <= max_keys <= MAX_MAX_KEYS:
        raise errors.invalid(f"max-keys must be in [1, {MAX_MAX_KEYS}]")
    marker = request.query.get("marker", "")

    directory, name_prefix = prefix, ""
    if prefix:
        node = store.get_node(container, prefix)
        if node is None or node.kind != KIND_DIRECTORY:
            directory, name_prefix = paths.split(prefix)
            parent = store.get_node(container, directory) if directory else None
            if directory and (parent is None or parent.kind != KIND_DIRECTORY):
                raise errors.no_such_file()
    after = ""
    if marker:
        marker = paths.normalise(marker)
        marker_dir, marker_name = paths.split(marker)
        if marker_dir == directory:
            after = marker_name

    entries: list[NodeRow] = []
    truncated = False
    cursor = after
    while len(entries) < max_keys:
        batch = store.children(container, directory, name_prefix=name_prefix, after=cursor, limit=1000)
        if not batch:
            break
        for child in batch:
            cursor = child.name
            if dirs_only and child.kind != KIND_DIRECTORY:
                continue
            if len(entries) == max_keys:
                truncated = True
                break
            entries.append(child)
        if truncated:
            break
    if not truncated and len(entries) == max_keys:
        truncated = any(
            not dirs_only or c.kind == KIND_DIRECTORY
            for c in store.children(container, directory, name_prefix=name_prefix, after=cursor, limit=1000)
        )
    if name_prefix and not entries and not after:
        raise errors.no_such_file()

    streams = store.streams_by_node([e.id for e in entries if e.kind == KIND_DIRECTORY]) if info else {}
    contents: list[str] = []
    prefixes: list[str] = []
    for entry in entries:
        if entry.kind == KIND_DIRECTORY:
            parts = [f"<Prefix>{escape(entry.path)}/</Prefix>"]
            if info:
                parts += _times(entry)
                if entry.id in streams:
                    shards, hours = streams[entry.id]
                    parts += [
                        f"<ShardCount>{shards}</ShardCount>",
                        f"<RetentionPeriodHours>{hours}</RetentionPeriodHours>",
                        f"<RetentionPeriodSec>{hours * 3600}</RetentionPeriodSec>",
                    ]
            prefixes.append("<CommonPrefixes>" + "".join(parts) + "</CommonPrefixes>")
            continue
        parts = [f"<Key>{escape(entry.path)}</Key>", f"<Size>{entry.size}</Size>"]
        if entry.kind == KIND_SHARD:
            shard = store.shard_by_node(entry.id)
            last = shard.last_seq if shard else 0
            parts += [f"<LastSequenceId>{last}</LastSequenceId>", f"<LastSequenceID>{last}</LastSequenceID>"]
        parts.append(f"<LastModified>{_iso(entry.mtime_ns)}</LastModified>")
        if info:
            parts += _times(entry)[1:]
        contents.append("<Contents>" + "".join(parts) + "</Contents>")

    next_marker = entries[-1].path if truncated and entries else ""
    xml = (
        '<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult>'
        f"<Name>{escape(container)}</Name><Prefix>{escape(raw_prefix)}</Prefix>"
        f"<Marker>{escape(request.query.get('marker', ''))}</Marker><Delimiter>/</Delimiter>"
        f"<NextMarker>{escape(next_marker)}</NextMarker><MaxKeys>{max_keys}</MaxKeys>"
        f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>"
        + "".join(contents)
        + "".join(prefixes)
        + "</ListBucketResult>"
    )
    return Response(200, xml.encode(), XML)


def _times(node: NodeRow) -> list[str]:
    mode = "040755" if node.kind == KIND_DIRECTORY else "0100644"
    return [
        f"<LastModified>{_iso(node.mtime_ns)}</LastModified>",
        f"<AccessTime>{_iso(node.mtime_ns)}</AccessTime>",
        f"<CreatingTime>{_iso(node.ctime_ns)}</CreatingTime>",
        f"<Mode>{mode}</Mode>",
        "<GID>0</GID>",
        "<UID>0</UID>",
        f"<InodeNumber>{node.id}</InodeNumber>",
    ]


def get_object(store: Storage, target: Target, request: Request) -> Response:
    node = store.get_node(target.container, target.path)
    if node is None:
        raise errors.no_such_file()
    if node.kind == KIND_DIRECTORY:
        return list_directory(store, target.container, _as_listing(request, target.path))
    data = store.get_data(node.id)
    status = 200
    header = request.headers.get("range")
    if header:
        match = _RANGE_RE.match(header.strip())
        if match is None:
            raise errors.invalid(f"Range {header[:60]!r} is not 'bytes=<first>[-<last>]'")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) else len(data) - 1
        data = data[first : last + 1]
        status = 206
    return Response(status, data, OCTET, [("Last-Modified", _http_date(node.mtime_ns))])


def _as_listing(request: Request, path: str) -> Request:
    return Request(request.method, request.path, {**request.query, "prefix": path + "/"}, request.headers, b"")


def put_object(store: Storage, target: Target, request: Request) -> Response:
    if not target.path:
        raise errors.invalid("the URL must name an object or a directory inside the container")
    append = request.headers.get("range", "").strip() == "-1"
    with store.transaction():
        node = store.get_node(target.container, target.path)
        if target.trailing_slash and not request.body:
            if node is not None and node.kind != KIND_DIRECTORY:
                raise errors.not_a_directory(target.path)
            namespace.ensure_directory(store, target.container, target.path)
            return Response(200)
        if node is not None and node.kind == KIND_DIRECTORY:
            raise errors.is_a_directory(target.path)
        if node is not None and node.kind == KIND_SHARD:
            raise errors.invalid(f"{target.path!r} is a stream shard; write to it with PutRecords")
        if node is None:
            namespace.ensure_directory(store, target.container, paths.split(target.path)[0])
            node = store.create_node(target.container, target.path, 1, data=request.body)
        else:
            store.set_data(node, request.body, append=append)
    return Response(200, headers=namespace.verifier(node))


def head_object(store: Storage, target: Target) -> Response:
    if not target.path:
        return Response(200, content_length=0)
    node = store.get_node(target.container, target.path)
    if node is None:
        raise errors.no_such_file()
    size = 0 if node.kind == KIND_DIRECTORY else node.size
    return Response(200, content_length=size, headers=[("Last-Modified", _http_date(node.mtime_ns))])


def delete_object(store: Storage, target: Target) -> Response:
    if not target.path:
        raise errors.not_permitted(403, "a container cannot be deleted")
    with store.transaction():
        node = store.get_node(target.container, target.path)
        if node is None:
            raise errors.no_such_file()
        store.delete_tree(node)
    return Response(204)
