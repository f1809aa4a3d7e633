"""SQLite persistence: one database file under the data directory, WAL journal, one connection.

The server handles one request at a time on its event loop and wraps every mutating request in one
transaction that commits before the response is sent, so an acknowledged write is in the WAL and
survives a killed server. ``synchronous=FULL`` also fsyncs every commit, which survives power loss
too, at several milliseconds per write.

Layout: ``nodes`` is the namespace (directories, objects/items, stream shards) with typed attributes
as JSON; ``streams`` marks directories that are streams; ``shards`` keeps each materialised shard's
sequence bounds; ``chunks`` holds stream records, one row per shard per PutRecords request: the
records of a chunk share one arrival time and are stored as the JSON array GetRecords answers with, so
a read is mostly byte concatenation.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import orjson

from dagster_streamgroup.local.v3io import paths
from dagster_streamgroup.local.v3io.attributes import TypedAttributes

KIND_OBJECT = 1
KIND_DIRECTORY = 2
KIND_SHARD = 3

DB_FILE = "v3io.sqlite3"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS nodes(
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    container TEXT NOT NULL,
    parent TEXT NOT NULL,
    name TEXT NOT NULL,
    kind INTEGER NOT NULL,
    attrs BLOB NOT NULL,
    data BLOB NOT NULL DEFAULT x'',
    ctime_ns INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    UNIQUE(container, parent, name)
);
CREATE TABLE IF NOT EXISTS streams(
    node_id INTEGER PRIMARY KEY,
    shard_count INTEGER NOT NULL,
    retention_hours INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS shards(
    node_id INTEGER PRIMARY KEY,
    stream_id INTEGER NOT NULL,
    shard_id INTEGER NOT NULL,
    first_seq INTEGER NOT NULL,
    last_seq INTEGER NOT NULL,
    last_arrival_ns INTEGER NOT NULL,
    UNIQUE(stream_id, shard_id)
);
CREATE TABLE IF NOT EXISTS chunks(
    id INTEGER PRIMARY KEY,
    shard INTEGER NOT NULL,
    first_seq INTEGER NOT NULL,
    last_seq INTEGER NOT NULL,
    arrival_ns INTEGER NOT NULL,
    body BLOB NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS chunks_by_seq ON chunks(shard, first_seq, last_seq, arrival_ns);
"""


@dataclass(slots=True)
class NodeRow:
    id: int
    container: str
    path: str
    kind: int
    attrs: TypedAttributes
    size: int
    ctime_ns: int
    mtime_ns: int

    @property
    def name(self) -> str:
        return paths.split(self.path)[1]


@dataclass(slots=True)
class StreamRow:
    node_id: int
    container: str
    path: str
    shard_count: int
    retention_hours: int


@dataclass(slots=True)
class ShardRow:
    node_id: int
    stream_id: int
    shard_id: int
    first_seq: int
    last_seq: int
    last_arrival_ns: int


ChunkRow = tuple[int, int, int, bytes]
"""(first_seq, last_seq, arrival_ns, body): ``body`` is a JSON array of GetRecords record objects."""


class Clock:
    """Modification times: strictly increasing across the whole server and never below an item's last one.

    That makes ``(__mtime_secs, __mtime_nsecs)`` a safe compare-and-set version even when two writes land
    in the same clock tick or the wall clock steps back across a restart.
    """

    def __init__(self, last_ns: int = 0) -> None:
        self._last = last_ns
        self._lock = threading.Lock()

    def next(self, previous_ns: int = 0) -> int:
        with self._lock:
            now = max(time.time_ns(), self._last + 1, previous_ns + 1)
            self._last = now
            return now


class Storage:
    def __init__(self, data_dir: Path, *, synchronous: str = "NORMAL") -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self.path = data_dir / DB_FILE
        self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={'FULL' if synchronous.upper() == 'FULL' else 'NORMAL'}")
        self.db.execute("PRAGMA foreign_keys=OFF")
        self.db.execute("PRAGMA cache_size=-65536")
        self.db.executescript(_SCHEMA)
        self.clock = Clock(self.db.execute("SELECT coalesce(max(mtime_ns), 0) FROM nodes").fetchone()[0])
        self._in_tx = False

    def close(self) -> None:
        try:
            self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            self.db.close()

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One request's writes, committed together before it is acknowledged (re-entrant)."""
        if self._in_tx:
            yield
            return
        self.db.execute("BEGIN IMMEDIATE")
        self._in_tx = True
        try:
            yield
        except BaseException:
            self._in_tx = False
            self.db.execute("ROLLBACK")
            raise
        self._in_tx = False
        self.db.execute("COMMIT")

    # --- namespace ------------------------------------------------------------------------------------

    def get_node(self, container: str, path: str) -> NodeRow | None:
        parent, name = paths.split(path)
        row = self.db.execute(
            "SELECT id, kind, attrs, length(data), ctime_ns, mtime_ns FROM nodes "
            "WHERE container=? AND parent=? AND name=?",
            (container, parent, name),
        ).fetchone()
        if row is None:
            return None
        return NodeRow(row[0], container, path, row[1], orjson.loads(row[2]), row[3], row[4], row[5])

    def get_data(self, node_id: int) -> bytes:
        row = self.db.execute("SELECT data FROM nodes WHERE id=?", (node_id,)).fetchone()
        return bytes(row[0]) if row else b""

    def create_node(
        self, container: str, path: str, kind: int, attrs: TypedAttributes | None = None, data: bytes = b""
    ) -> NodeRow:
        parent, name = paths.split(path)
        now = self.clock.next()
        cursor = self.db.execute(
            "INSERT INTO nodes(container, parent, name, kind, attrs, data, ctime_ns, mtime_ns) VALUES(?,?,?,?,?,?,?,?)",
            (container, parent, name, kind, orjson.dumps(attrs or {}), data, now, now),
        )
        node_id = cursor.lastrowid
        assert node_id is not None
        return NodeRow(node_id, container, path, kind, dict(attrs or {}), len(data), now, now)

    def touch(self, node: NodeRow) -> None:
        node.mtime_ns = self.clock.next(node.mtime_ns)
        self.db.execute("UPDATE nodes SET mtime_ns=? WHERE id=?", (node.mtime_ns, node.id))

    def set_attrs(self, node: NodeRow, attrs: TypedAttributes) -> None:
        node.attrs = attrs
        node.mtime_ns = self.clock.next(node.mtime_ns)
        self.db.execute(
            "UPDATE nodes SET attrs=?, mtime_ns=? WHERE id=?", (orjson.dumps(attrs), node.mtime_ns, node.id)
        )

    def set_data(self, node: NodeRow, data: bytes, *, append: bool) -> None:
        if append:
            data = self.get_data(node.id) + data
        node.mtime_ns = self.clock.next(node.mtime_ns)
        node.size = len(data)
        self.db.execute("UPDATE nodes SET data=?, mtime_ns=? WHERE id=?", (data, node.mtime_ns, node.id))

    def children(
        self, container: str, directory: str, *, name_prefix: str = "", after: str = "", limit: int = 1000
    ) -> list[NodeRow]:
        """Children of a directory in name order, starting after ``after``."""
        rows = self.db.execute(
            "SELECT id, name, kind, attrs, length(data), ctime_ns, mtime_ns FROM nodes "
            "WHERE container=? AND parent=? AND name>? AND substr(name, 1, ?)=? ORDER BY name LIMIT ?",
            (container, directory, after, len(name_prefix), name_prefix, limit),
        ).fetchall()
        return [
            NodeRow(r[0], container, paths.join(directory, r[1]), r[2], orjson.loads(r[3]), r[4], r[5], r[6])
            for r in rows
        ]

    def has_children(self, container: str, directory: str) -> bool:
        row = self.db.execute(
            "SELECT 1 FROM nodes WHERE container=? AND parent=? LIMIT 1", (container, directory)
        ).fetchone()
        return row is not None

    def delete_tree(self, node: NodeRow) -> None:
        """Delete a node and, for a directory, everything under it (streams, shards and records too)."""
        ids = [node.id]
        if node.kind == KIND_DIRECTORY:
            prefix = node.path + "/"
            ids += [
                r[0]
                for r in self.db.execute(
                    "SELECT id FROM nodes WHERE container=? AND (parent=? OR substr(parent, 1, ?)=?)",
                    (node.container, node.path, len(prefix), prefix),
                )
            ]
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            self.db.execute(f"DELETE FROM chunks WHERE shard IN ({marks})", chunk)
            self.db.execute(f"DELETE FROM shards WHERE node_id IN ({marks})", chunk)
            self.db.execute(f"DELETE FROM streams WHERE node_id IN ({marks})", chunk)
            self.db.execute(f"DELETE FROM nodes WHERE id IN ({marks})", chunk)

    # --- streams --------------------------------------------------------------------------------------

    def get_stream(self, node: NodeRow) -> StreamRow | None:
        row = self.db.execute("SELECT shard_count, retention_hours FROM streams WHERE node_id=?", (node.id,)).fetchone()
        return StreamRow(node.id, node.container, node.path, row[0], row[1]) if row else None

    def streams_by_node(self, node_ids: Sequence[int]) -> dict[int, tuple[int, int]]:
        if not node_ids:
            return {}
        marks = ",".join("?" * len(node_ids))
        rows = self.db.execute(
            f"SELECT node_id, shard_count, retention_hours FROM streams WHERE node_id IN ({marks})",
            list(node_ids),
        )
        return {r[0]: (r[1], r[2]) for r in rows}

    def create_stream(self, node: NodeRow, shard_count: int, retention_hours: int) -> StreamRow:
        self.db.execute(
            "INSERT INTO streams(node_id, shard_count, retention_hours) VALUES(?,?,?)",
            (node.id, shard_count, retention_hours),
        )
        return StreamRow(node.id, node.container, node.path, shard_count, retention_hours)

    def set_shard_count(self, stream: StreamRow, shard_count: int) -> None:
        self.db.execute("UPDATE streams SET shard_count=? WHERE node_id=?", (shard_count, stream.node_id))
        stream.shard_count = shard_count

    def get_shard(self, stream_id: int, shard_id: int) -> ShardRow | None:
        row = self.db.execute(
            "SELECT node_id, first_seq, last_seq, last_arrival_ns FROM shards WHERE stream_id=? AND shard_id=?",
            (stream_id, shard_id),
        ).fetchone()
        return ShardRow(row[0], stream_id, shard_id, row[1], row[2], row[3]) if row else None

    def shard_by_node(self, node_id: int) -> ShardRow | None:
        row = self.db.execute(
            "SELECT stream_id, shard_id, first_seq, last_seq, last_arrival_ns FROM shards WHERE node_id=?",
            (node_id,),
        ).fetchone()
        return ShardRow(node_id, row[0], row[1], row[2], row[3], row[4]) if row else None

    def create_shard(self, stream: StreamRow, shard_id: int) -> ShardRow:
        node = self.create_node(stream.container, paths.join(stream.path, str(shard_id)), KIND_SHARD)
        self.db.execute(
            "INSERT INTO shards(node_id, stream_id, shard_id, first_seq, last_seq, last_arrival_ns) "
            "VALUES(?,?,?,1,0,0)",
            (node.id, stream.node_id, shard_id),
        )
        return ShardRow(node.id, stream.node_id, shard_id, 1, 0, 0)

    def append_chunk(self, shard: ShardRow, last_seq: int, arrival_ns: int, body: bytes) -> None:
        """Store records ``shard.last_seq + 1 .. last_seq`` and move the shard's bounds."""
        self.db.execute(
            "INSERT INTO chunks(shard, first_seq, last_seq, arrival_ns, body) VALUES(?,?,?,?,?)",
            (shard.node_id, shard.last_seq + 1, last_seq, arrival_ns, body),
        )
        shard.last_seq = last_seq
        shard.last_arrival_ns = arrival_ns
        self.db.execute(
            "UPDATE shards SET last_seq=?, last_arrival_ns=? WHERE node_id=?", (last_seq, arrival_ns, shard.node_id)
        )
        self.db.execute("UPDATE nodes SET mtime_ns=max(mtime_ns + 1, ?) WHERE id=?", (self.clock.next(), shard.node_id))

    def trim(self, shard: ShardRow, cutoff_ns: int) -> None:
        """Drop chunks that arrived before ``cutoff_ns``; sequence numbers never restart."""
        row = self.db.execute(
            "SELECT arrival_ns FROM chunks WHERE shard=? ORDER BY first_seq LIMIT 1", (shard.node_id,)
        ).fetchone()
        if row is None or row[0] >= cutoff_ns:
            return
        first = self.first_seq_at_or_after(shard, cutoff_ns)
        self.db.execute("DELETE FROM chunks WHERE shard=? AND first_seq<?", (shard.node_id, first))
        self.db.execute("UPDATE shards SET first_seq=? WHERE node_id=?", (first, shard.node_id))
        shard.first_seq = first

    def first_seq_at_or_after(self, shard: ShardRow, arrival_ns: int) -> int:
        """First sequence number that arrived at or after ``arrival_ns`` (``last_seq + 1`` if none).

        Arrival times never decrease along a shard, so a binary search over sequence numbers finds it.
        """
        low, high = shard.first_seq, shard.last_seq + 1
        while low < high:
            mid = (low + high) // 2
            row = self.db.execute(
                "SELECT first_seq, arrival_ns FROM chunks WHERE shard=? AND first_seq<=? "
                "ORDER BY first_seq DESC LIMIT 1",
                (shard.node_id, mid),
            ).fetchone()
            if row is None or row[1] >= arrival_ns:
                high = mid if row is None else min(mid, row[0])
            else:
                low = mid + 1
        return max(low, shard.first_seq)

    def read_chunks(self, shard: ShardRow, from_seq: int, max_records: int) -> list[ChunkRow]:
        """The chunks holding records ``from_seq ..``, enough for ``max_records`` records."""
        cursor = self.db.execute(
            "SELECT first_seq, last_seq, arrival_ns, body FROM chunks WHERE shard=? AND first_seq >= "
            "coalesce((SELECT max(first_seq) FROM chunks WHERE shard=? AND first_seq<=?), 0) ORDER BY first_seq",
            (shard.node_id, shard.node_id, from_seq),
        )
        out: list[ChunkRow] = []
        count = 0
        for row in cursor:
            out.append(row)
            count += row[1] - max(row[0], from_seq) + 1
            if count >= max_records:
                break
        cursor.close()
        return out
