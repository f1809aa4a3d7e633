"""The store and stream clients a process keeps, one per configuration: a code server's ticks share their
connections, and a run worker releases them between runs (``launcher/child.py``). Below the Dagster layer, so
the launcher can release them without importing it."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from typing import TypeVar

from dagster_streamgroup.stores.base import StateStore
from dagster_streamgroup.streams.base import StreamBackend

T = TypeVar("T")

_cache_lock = threading.Lock()
stores: dict[str, tuple[str, StateStore]] = {}
backends: dict[str, tuple[str, StreamBackend]] = {}


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()  # the texts may hold secrets: keep only a digest


def cached(cache: dict[str, tuple[str, T]], identity: str, credentials: str, make: Callable[[], T]) -> T:
    """One client per ``identity`` (the configuration without its secrets), rebuilt when ``credentials`` change.

    The code server lives for days and secrets rotate: a client keyed by its secret too would stay in the
    cache beside its successor after every rotation, with its sockets and librdkafka threads. The replaced
    client is dropped, not closed, because a tick or run on another thread may still be using it."""
    key, fingerprint = _digest(identity), _digest(credentials)
    with _cache_lock:
        entry = cache.get(key)
        if entry is None or entry[0] != fingerprint:
            entry = (fingerprint, make())
            cache[key] = entry
        return entry[1]


def release_cached_clients() -> None:
    """Close and forget every cached store and stream client of this process.

    For a process that outlives the servers its clients talk to (a test session stopping its broker, a
    code server told to reload): a librdkafka client left alive reconnects and logs a refused connection
    every second until the process ends."""
    with _cache_lock:
        clients: list[StateStore | StreamBackend] = [client for _, client in stores.values()]
        clients += [client for _, client in backends.values()]
        stores.clear()
        backends.clear()
    for client in clients:
        client.close()
