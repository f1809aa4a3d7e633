"""Each run's SQLite event database copied from an empty one of the same schema instead of built table by table.

On SQLite every run has an event database of its own, which the process that stores the run's first event (the
daemon, for the member runs its sensors create) builds with ``create_all``: every table and index of Dagster's
event log, each a statement SQLAlchemy compiles and SQLite executes, then journal mode and the alembic version
row. That is about 13 ms of CPU a run in the daemon, three quarters of what creating the database costs with the
other patches (``docs/benchmarks.md``), while copying a file of the same schema costs 0.1 ms.

So the first run database a process creates is built by Dagster as before, in a temporary folder, and its bytes
are kept; every later one is those bytes written to a temporary file beside the run's, flushed to disk, and
linked to the run's name, which fails if the name exists: a database another process created (or began to
create) meanwhile is never replaced, and that case, like an existing file, goes through Dagster's own path,
whose check finds it at the head. The copy holds the same tables, indexes, journal mode and version row (the
tests compare them); its bytes are taken from Dagster's own database in the same process, so a Dagster upgrade,
which restarts the processes, makes a new one. Only run databases are copied: the index shard keeps Dagster's
path with its own migrations.

The run coordinator installs it where runs are created (the daemon and the webserver). Dagster's module is
imported only once the guard (``dagster_streamgroup.patches.enabled``) allows it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as db
from sqlalchemy.pool import NullPool

from dagster_streamgroup import patches

MODULE = "dagster._core.storage.event_log.sqlite.sqlite_event_log"
WAL_MODE = 2
"""SQLite's file format version bytes (offsets 18 and 19 of the header) in WAL mode."""

logger = logging.getLogger(__name__)


def _build_template(initdb: Callable[..., None], storage: Any) -> bytes | None:
    """Dagster's own new run database, built in a temporary folder and read back once every connection to it is
    closed (the last close checkpoints the write-ahead log into the file); None when it is not a WAL database in
    one file."""
    with tempfile.TemporaryDirectory(prefix="streamgroup-run-db-") as folder:
        path = Path(folder) / "template.db"
        engine = db.create_engine(f"sqlite:///{path}", poolclass=NullPool)
        try:
            initdb(storage, engine)
        finally:
            engine.dispose()
        if Path(f"{path}-wal").exists():
            return None
        content = path.read_bytes()
    if len(content) < 100 or content[18] != WAL_MODE or content[19] != WAL_MODE:
        return None
    return content


class KeptCopy:
    """The bytes of an empty run database, built once per process (None when Dagster's was not one to copy)."""

    def __init__(self) -> None:
        self.content: bytes | None = None
        self.built = False
        self._lock = threading.Lock()

    def get(self, initdb: Callable[..., None], storage: Any) -> bytes | None:
        with self._lock:
            if not self.built:
                try:
                    self.content = _build_template(initdb, storage)
                except Exception:  # Dagster's own path builds each database (and raises its own errors)
                    logger.warning("dagster-streamgroup: no copy of an empty run database", exc_info=True)
                self.built = True
            return self.content


KEPT = KeptCopy()


def _place(path: str, content: bytes) -> bool:
    """``content`` as a new file at ``path``, complete on disk before the name appears; False when ``path``
    exists."""
    folder, name = os.path.split(path)
    fd, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder or None)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(content)
            file.flush()
            os.fsync(file.fileno())
        os.link(temporary, path)
    except FileExistsError:
        return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
    return True


def _from_template(initdb: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(initdb)
    def _initdb(storage: Any, engine: Any, for_index_shard: bool = False) -> None:
        path = engine.url.database
        if not for_index_shard and path and path != ":memory:" and not os.path.exists(path):
            content = KEPT.get(initdb, storage)
            if content is not None and _place(path, content):
                return
        initdb(storage, engine, for_index_shard)

    setattr(_initdb, patches.ORIGINAL, initdb)
    return _initdb


def install() -> bool:
    """Create run event databases from the kept copy; False on a Dagster the patches were not verified on, or
    where the storage's database set-up is not the method this module knows (it is then left alone)."""
    if not patches.enabled():
        return False
    storage_class = importlib.import_module(MODULE).SqliteEventLogStorage
    return patches.wrap_methods([(storage_class, "_initdb")], lambda initdb, _name: _from_template(initdb))
