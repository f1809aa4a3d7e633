"""The example project under a real ``dagster dev`` with local Spark, on each stream it supports (opt-in).

Kafka (the real local broker) and v3io (the real local v3io server, group state next to the stream, access
key required and given only as ``V3IO_ACCESS_KEY``): 200,000 clickstream events over 8 shards, 3 member
sensors, through ``run_example_scenario``: every run succeeds; materializations cover every offset of every
shard exactly once, contiguously; the offsets mirrored into the stream (Kafka's group offsets, the v3io shard
attribute) equal the high watermarks; a stopped member's shards are re-owned; a CLI backfill re-processes a
range without moving offsets; the daemon is killed mid-stream and started again. ``test_smoke.py`` runs a
smaller setting of the same scenario in the default suite.
"""

from __future__ import annotations

import secrets
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dagster_streamgroup.local.v3io.testing import running_v3io_server
from tests.e2e.scenario import ExampleStream, KafkaExample, V3ioExample, run_example_scenario

pytestmark = [pytest.mark.e2e, pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(3600)]

PARTITIONS = 8
MEMBERS = 3
MESSAGES = 200_000
HEARTBEAT_S = 5.0
SESSION_TIMEOUT_S = 20.0
DRAIN_TIMEOUT_S = 1500.0
"""Generous: on 2 shared cores a Spark run costs tens of seconds (minutes under load) before it reads."""


@pytest.fixture
def work_dir() -> Iterator[Path]:
    """Not pytest's tmp_path: a concurrent pytest session prunes old basetemps, this instance among them."""
    with tempfile.TemporaryDirectory(prefix="streamgroup-e2e-") as tmp:
        yield Path(tmp)


@pytest.fixture
def example_stream(request: pytest.FixtureRequest, work_dir: Path) -> Iterator[ExampleStream]:
    if request.param == "kafka":
        yield KafkaExample(
            request.getfixturevalue("kafka_bootstrap"), work_dir / "home", PARTITIONS, HEARTBEAT_S, SESSION_TIMEOUT_S
        )
        return
    # A server of its own, over this test's directory, that only accepts a key generated for it.
    with running_v3io_server(work_dir / "v3io-data", access_key=secrets.token_hex(16)) as server:
        stream = V3ioExample(server, PARTITIONS, HEARTBEAT_S, SESSION_TIMEOUT_S)
        try:
            yield stream
        finally:
            stream.close()


@pytest.mark.parametrize(
    "example_stream",
    [pytest.param("kafka", marks=pytest.mark.kafka), pytest.param("v3io", marks=pytest.mark.v3io)],
    indirect=True,
)
def test_example_under_dagster_dev(example_stream: ExampleStream, work_dir: Path) -> None:
    run_example_scenario(
        example_stream,
        work_dir,
        members=MEMBERS,
        messages=MESSAGES,
        heartbeat_s=HEARTBEAT_S,
        session_timeout_s=SESSION_TIMEOUT_S,
        drain_timeout_s=DRAIN_TIMEOUT_S,
        backfill=True,
    )
