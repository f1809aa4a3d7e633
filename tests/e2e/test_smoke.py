"""A smoke test of the example in a real Dagster deployment laid out as a production host runs it, in the
default suite: ``dagster api grpc`` serving the code location, ``dagster-daemon run`` and ``dagster-webserver``
pointed at it (docs/deploying.md; the layout ``bench.e2e`` measures; the other deployments of the suite run
``dagster dev``).

2 member sensors over a 4-partition Kafka topic, about 20,000 clickstream events, one member stopped (its shards
re-owned within a tick plus the margin of ``scenario.MARGIN_TICKS``), one daemon restart, the Dagster instance on
PostgreSQL: every offset committed exactly once, as Dagster's materializations show over GraphQL, each counting
every record of its range, and the example's output holds them (the clicks Delta table, one row per record; the
page views per minute, kept by Dagster's automation as ranges land, a recount of those rows). The
long setting of the same scenario (both streams, a CLI backfill, 200,000 events) is ``test_dagster_dev.py``.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.scenario import KafkaExample, run_example_scenario

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def work_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="streamgroup-smoke-") as tmp:
        yield Path(tmp)


def test_smoke_in_a_production_layout(kafka_bootstrap: str, work_dir: Path) -> None:
    stream = KafkaExample(kafka_bootstrap, work_dir / "home", partitions=4, heartbeat_s=5.0, session_timeout_s=20.0)
    run_example_scenario(
        stream,
        work_dir,
        members=2,
        messages=20_000,
        heartbeat_s=5.0,
        session_timeout_s=20.0,
        drain_timeout_s=240.0,
        backfill=False,
        # The Dagster instance on PostgreSQL, as a production deployment keeps it (docs/deploying.md); the clicks
        # in a Delta table and page views per minute kept by Dagster's automation, as scripts/example.sh runs them.
        extra_env={"CLICKSTREAM_MAX_WAIT_S": "2", "DAGSTER_STORAGE": "postgres", "CLICKSTREAM_SINK": "delta"},
        layout="services",
    )
