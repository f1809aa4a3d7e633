"""Shared pieces of the bad-input catalogue (docs/reliability.md): a policy that acts within one tick, members
over real stores and streams, and private servers a test may pause or cut without disturbing the others.

The session's broker, PostgreSQL and v3io server come from tests/fixtures/; a test that pauses a broker gets
one of its own (``private_broker``), and one that takes PostgreSQL away does it through a TCP forwarder, so the
shared server keeps serving every other test."""

from __future__ import annotations

import gc
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from dagster_streamgroup.dagster.resources import release_cached_clients
from dagster_streamgroup.local.kafka_broker import BrokerInfo, running_broker
from dagster_streamgroup.member import GroupMember
from dagster_streamgroup.protocol import CommitOutcome, GroupPolicy, GroupState, inflight_launches, report_of
from dagster_streamgroup.stores.base import StateStore
from dagster_streamgroup.streams.base import StreamBackend
from dagster_streamgroup.streams.kafka import KafkaBackend
from dagster_streamgroup.streams.kafka_config import KafkaStreamConfig
from tests.integration.spark.conftest import spark  # noqa: F401  (the session-wide local Spark session)
from tests.integration.v3io.conftest import new_stream  # noqa: F401  (the v3io stream factory fixture)
from tests.reliability.faults import TcpForwarder

SESSION_TIMEOUT_S = 3.0


def policy(**overrides: Any) -> GroupPolicy:
    """Members that claim at once, launch any backlog at once, and evict a peer after 3 s."""
    fields: dict[str, Any] = {
        "heartbeat_interval_s": 1,
        "session_timeout_s": SESSION_TIMEOUT_S,
        "join_grace_s": 0,
        "min_backlog": 1,
        "max_wait_s": 0,
        "max_records_per_run": 10_000,
        "max_attempts": 3,
    }
    return GroupPolicy(**{**fields, **overrides})


def member_of(
    store: StateStore, backend: StreamBackend, group: str, member_id: str = "m0", **overrides: Any
) -> GroupMember:
    return GroupMember(store, backend, group, member_id, policy(**overrides), sleep=lambda _s: None)


def kafka_backend(bootstrap: str, *topics: str, **properties: str) -> KafkaBackend:
    config = KafkaStreamConfig(bootstrap_servers=bootstrap, topics=list(topics), properties=properties)
    return KafkaBackend(config, request_timeout_s=5.0, stall_timeout_s=3.0)


def commit_in_flight(member: GroupMember) -> dict[str, CommitOutcome]:
    """Commit every range the member has in flight, as its runs would after processing them."""
    state = member.load()
    assert state is not None
    return {launch.shard: member.commit(report_of(launch)) for launch in inflight_launches(state, member.member_id)}


def offsets(state: GroupState | None) -> dict[str, int | None]:
    assert state is not None
    return {shard_id: shard.committed for shard_id, shard in state.shards.items()}


def assert_not_backwards(before: dict[str, int | None], after: dict[str, int | None]) -> None:
    for shard, offset in before.items():
        if offset is not None:
            moved = after.get(shard)
            assert moved is not None and moved >= offset, f"{shard}: {offset} -> {moved}"


def sqlite_row(url: str, key: str) -> tuple[Any, ...] | None:
    """The raw row of ``key`` in a SQLite store, read around the store (what an operator would see)."""
    database = make_url(url).database
    assert database is not None
    with sqlite3.connect(database) as conn:
        row = conn.execute("SELECT version, kind, schema_version, body FROM streamgroup_state WHERE key = ?", (key,))
        found: tuple[Any, ...] | None = row.fetchone()
        return found


@pytest.fixture
def private_broker() -> Iterator[BrokerInfo]:
    """A broker of this test alone, which it may pause (SIGSTOP) without stalling the session's broker."""
    with running_broker() as broker:
        yield broker
        # A client still alive when its broker stops logs a refused connection every second until it is freed;
        # one kept only by a reference cycle (a traceback, a callback) goes with a collection.
        release_cached_clients()
        gc.collect()


@pytest.fixture
def postgres_forwarder(postgres_url: str) -> Iterator[tuple[str, TcpForwarder]]:
    """The session's PostgreSQL behind a TCP forwarder: (URL through the forwarder, the forwarder)."""
    url = make_url(postgres_url)
    assert url.host is not None and url.port is not None
    forwarder = TcpForwarder((url.host, url.port))
    try:
        yield url.set(port=forwarder.port).render_as_string(hide_password=False), forwarder
    finally:
        forwarder.close()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'state' / 'streamgroup-state.db'}"
