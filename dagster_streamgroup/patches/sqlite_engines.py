"""Dagster's SQLite storages with one SQLAlchemy engine per database file instead of one per connection.

Dagster's SQLite run, event-log and schedule storages build a new engine (``NullPool``) for every connection
they open. SQLAlchemy keeps compiled statements per engine (the cache key holds the engine's dialect), so every
INSERT of every event is compiled again: in a CPU profile of run workers during ``bench.e2e`` the compilation
and the engines' construction were about a fifth of their Python time. An engine on ``NullPool`` holds no
connection: each ``connect()`` still opens a new SQLite connection and closes it on release, ``dispose()`` only
replaces the (empty) pool, so sharing one engine per (URL, options) changes nothing but the compiled statements
kept. The fork server installs it before it forks (each run worker opens a few database files: the instance's
and its run's own event database), and member sensors install it in the code server; a bounded cache keeps a
long-lived process from holding an engine for every run's event database it ever read.

Dagster's modules are imported only once the guard (``dagster_streamgroup.patches.enabled``) allows it.
"""

from __future__ import annotations

import importlib
from functools import lru_cache
from typing import Any

import sqlalchemy as db
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool

from dagster_streamgroup import patches

STORAGE_MODULES = (
    "dagster._core.storage.runs.sqlite.sqlite_run_storage",
    "dagster._core.storage.event_log.sqlite.sqlite_event_log",
    "dagster._core.storage.schedules.sqlite.sqlite_schedule_storage",
)
"""The modules whose ``create_engine`` (SQLAlchemy's, imported by name) builds an engine per connection."""

ENGINES_KEPT = 32


@lru_cache(maxsize=ENGINES_KEPT)
def _engine(url: str, connect_args: tuple[tuple[str, Any], ...]) -> Engine:
    return db.create_engine(url, poolclass=NullPool, connect_args=dict(connect_args))


def create_engine(url: Any, **options: Any) -> Engine:
    """SQLAlchemy's ``create_engine`` for the options Dagster's SQLite storages pass (``poolclass=NullPool``,
    optionally ``connect_args``): the same engine for the same URL and options. Anything else is built anew."""
    connect_args = options.get("connect_args", {})
    if set(options) - {"poolclass", "connect_args"} or options.get("poolclass") is not NullPool:
        return db.create_engine(url, **options)
    try:
        key = tuple(sorted(connect_args.items()))
        hash(key)
    except (AttributeError, TypeError):
        return db.create_engine(url, **options)
    return _engine(str(url), key)


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
