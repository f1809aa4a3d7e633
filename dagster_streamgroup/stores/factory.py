"""Choosing a state store from its URL, so configuration is one string.

The scheme picks the implementation; adding a store is one entry in ``_OPENERS``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from dagster_streamgroup.redact import read
from dagster_streamgroup.stores.base import StateStore, StoreConfigError
from dagster_streamgroup.stores.memory import MemoryStore
from dagster_streamgroup.stores.sql import normalize_url

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*")


def _open_sql(url: str) -> StateStore:
    from dagster_streamgroup.stores.sql_log import LoggedSqlStateStore

    return LoggedSqlStateStore(url)


def _open_memory(url: str) -> StateStore:
    return MemoryStore(time.time)


def _open_v3io(url: str) -> StateStore:
    from dagster_streamgroup.stores.v3io import V3ioStateStore  # imports the v3io client only when used

    return V3ioStateStore.from_url(url)


_OPENERS: dict[str, Callable[[str], StateStore]] = {
    "sqlite": _open_sql,
    "postgresql": _open_sql,
    "postgresql+psycopg": _open_sql,
    "postgres": _open_sql,
    "memory": _open_memory,
    "v3io": _open_v3io,
}

SUPPORTED = (
    "sqlite:///PATH (a file, one host)",
    "postgresql://USER:PASSWORD@HOST:PORT/DB (many hosts)",
    "memory:// (one process, tests only)",
    "v3io://HOST:PORT/CONTAINER[/DIR][?https=true&access_key_file=PATH] (next to a v3io stream, or in DIR)",
)


def _opener(url: str, field: str) -> Callable[[str], StateStore]:
    """The store of ``url``'s scheme. A refused URL is shown only as ``redact`` shows it: a DSN or a mistyped
    URL may hold a password anywhere."""
    scheme, sep, _ = url.partition("://")
    opener = _OPENERS.get(scheme.lower()) if sep else None
    if opener is None:
        reading = read(url)
        if not sep and reading.well_formed:
            hint = "a libpq keyword DSN is not a store URL: write it as postgresql://USER:PASSWORD@HOST:PORT/DB"
        elif sep and _SCHEME.fullmatch(scheme):
            hint = f"no state store has the scheme {scheme!r}"
        else:
            hint = "it does not start with SCHEME:// (the rest is not shown: it may hold a password)"
        raise StoreConfigError(
            f"{field}: {reading.shown} is not a state store URL ({hint}); supported: {'; '.join(SUPPORTED)}"
        )
    return opener


def _check_v3io(url: str) -> None:
    from dagster_streamgroup.stores.v3io import parse_store_url

    parse_store_url(url)


_CHECKS: dict[Callable[[str], StateStore], Callable[[str], object]] = {
    _open_sql: normalize_url,
    _open_v3io: _check_v3io,
}


def check_store_url(url: str, *, field: str = "store_url") -> None:
    """Refuse at configuration time, without connecting, a URL no store opens (a SQLite URL without a
    file, a port that is not a number, an unknown v3io option), or one the sensor ticks and every run
    (separate processes) cannot share, as ``memory://``."""
    opener = _opener(url, field)
    if opener is _open_memory:
        raise StoreConfigError(
            f"{field}: memory:// keeps the state inside one process, but the sensors and every run are separate "
            "processes that must share it; use sqlite:///PATH (one host) or postgresql://... (many hosts)"
        )
    try:
        _CHECKS[opener](url)
    except StoreConfigError as exc:
        raise type(exc)(f"{field}: {exc}") from None


def open_store(url: str, *, field: str = "store_url") -> StateStore:
    """Open the store that ``url`` names. ``field`` is the configuration field the URL came from, so a bad
    value is reported where the user can fix it."""
    opener = _opener(url, field)
    try:
        return opener(url)
    except StoreConfigError as exc:
        raise type(exc)(f"{field}: {exc}") from None
