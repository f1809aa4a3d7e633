"""Dagster's SQLite storages with one SQLAlchemy engine per database file, whose connections are kept open.

Dagster's SQLite run, event-log and schedule storages build a new engine (``NullPool``) for every connection
they open, and the event log disposes of it after each one. SQLAlchemy keeps compiled statements per engine
(the cache key holds the engine's dialect), so every INSERT of every event was compiled again; and each of the
four connections an event opens paid for opening the SQLite file and reading its schema again: 0.64 ms of CPU
a connection through a new ``NullPool`` connection against 0.10 ms for one taken from a pool (this machine, a
Dagster index database). In a CPU profile of run workers during ``bench.e2e`` the compilation and the engines'
construction were about a fifth of their Python time; opening the connections was most of what remained of
storing an event.

So the storages get one engine per (URL, options), with a pool that keeps a few connections open between uses
(``KeptConnectionPool``: Dagster's ``dispose()`` after each connection leaves them open), and three guards that
make a kept connection safe where a new one was:

- **the file it was opened on**: a database file deleted or replaced since (``wipe`` deletes and recreates the
  event log's files) makes the connection be dropped at its next checkout and a new one opened on the file now
  at that path, instead of reading or writing the deleted one;
- **the process it was opened in**: SQLite connections must not cross a ``fork``; a child forgets the parent's
  engines and opens its own (it holds the parent's for good, never using or closing them);
- **the thread**: a connection goes to one thread at a time (the pool's checkout), so ``check_same_thread``
  is off as the pool needs.

The fork server installs it before it forks (each run worker opens a few database files: the instance's and
its run's own event database); member sensors install it in the code server, and ``MemberRunCoordinator`` in
the daemon; a bounded cache keeps a long-lived process from holding an engine for every run's event database
it ever read. Dagster's modules are imported only once the guard (``dagster_streamgroup.patches.enabled``)
allows it.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import sqlalchemy as db
from sqlalchemy import event, exc
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool, QueuePool

from dagster_streamgroup import patches

STORAGE_MODULES = (
    "dagster._core.storage.runs.sqlite.sqlite_run_storage",
    "dagster._core.storage.event_log.sqlite.sqlite_event_log",
    "dagster._core.storage.schedules.sqlite.sqlite_schedule_storage",
)
"""The modules whose ``create_engine`` (SQLAlchemy's, imported by name) builds an engine per connection."""

ENGINES_KEPT = 32
CONNECTIONS_KEPT = 2
"""Open connections an engine keeps between uses; more at once are opened and closed as before."""
OVERFLOW = 16

_FILE_ID = "streamgroup_file_id"


class KeptConnectionPool(QueuePool):
    """A ``QueuePool`` that outlives ``Engine.dispose()``: Dagster's event log disposes of its engine after
    every connection, which would close what the pool keeps. Its connections close when the engine is
    dropped from the cache and collected."""

    def dispose(self) -> None:
        return None

    def recreate(self) -> KeptConnectionPool:
        return self


class _Engines:
    """The engines by (URL, options), least recently used dropped past ``ENGINES_KEPT``; per process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._engines: OrderedDict[tuple[str, tuple[tuple[str, Any], ...]], Engine] = OrderedDict()
        self._inherited: list[Engine] = []
        self.hits = self.misses = 0

    def get(self, url: str, connect_args: tuple[tuple[str, Any], ...]) -> Engine:
        key = (url, connect_args)
        with self._lock:
            engine = self._engines.get(key)
            if engine is not None:
                self._engines.move_to_end(key)
                self.hits += 1
                return engine
            self.misses += 1
            engine = _new_engine(url, dict(connect_args))
            self._engines[key] = engine
            while len(self._engines) > ENGINES_KEPT:
                self._engines.popitem(last=False)
            return engine

    def __len__(self) -> int:
        return len(self._engines)

    def clear(self) -> None:
        with self._lock:
            self._engines.clear()
            self.hits = self.misses = 0

    def forget_after_fork(self) -> None:
        """In a forked child: the parent's engines are never used again, nor closed (closing a connection
        opened before the fork could disturb the parent's locks), so they are held here for good."""
        self._lock = threading.Lock()
        self._inherited.extend(self._engines.values())
        self._engines = OrderedDict()


ENGINES = _Engines()
os.register_at_fork(after_in_child=ENGINES.forget_after_fork)


def _file_id(path: str) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


def _new_engine(url: str, connect_args: dict[str, Any]) -> Engine:
    parsed = db.engine.make_url(url)
    database = parsed.database
    if parsed.get_backend_name() != "sqlite" or not database or database == ":memory:" or database.startswith("file:"):
        return db.create_engine(url, poolclass=NullPool, connect_args=connect_args)
    path = str(Path(database).resolve())
    engine = db.create_engine(
        url,
        poolclass=KeptConnectionPool,
        pool_size=CONNECTIONS_KEPT,
        max_overflow=OVERFLOW,
        connect_args={**connect_args, "check_same_thread": False},
    )

    @event.listens_for(engine, "connect")
    def remember_file(dbapi_connection: Any, record: Any) -> None:
        record.info[_FILE_ID] = _file_id(path)

    @event.listens_for(engine, "checkout")
    def same_file(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        # A kept connection to a file since deleted or replaced would read and write the old inode.
        opened_on = record.info.get(_FILE_ID)
        if opened_on is None or opened_on != _file_id(path):
            raise exc.DisconnectionError(f"{path}: the database file changed since the connection was opened")

    return engine


def create_engine(url: Any, **options: Any) -> Engine:
    """SQLAlchemy's ``create_engine`` for the options Dagster's SQLite storages pass (``poolclass=NullPool``,
    optionally ``connect_args``): the same engine for the same URL and options, keeping its connections.
    Anything else is built anew, as asked."""
    connect_args = options.get("connect_args", {})
    if set(options) - {"poolclass", "connect_args"} or options.get("poolclass") is not NullPool:
        return db.create_engine(url, **options)
    try:
        key = tuple(sorted(connect_args.items()))
        hash(key)
    except (AttributeError, TypeError):
        return db.create_engine(url, **options)
    return ENGINES.get(str(url), key)


def install() -> bool:
    """Make Dagster's SQLite storages share engines; False on a Dagster the patches were not verified on, or
    where a module's ``create_engine`` is not the one this module knows (that module is then left alone, the
    others are still installed)."""
    if not patches.enabled():
        return False
    installed = True
    for name in STORAGE_MODULES:
        module: Any = importlib.import_module(name)
        current = getattr(module, "create_engine", None)
        if current is create_engine:
            continue
        if current is not db.create_engine:
            installed = False
            continue
        module.create_engine = create_engine
    return installed
