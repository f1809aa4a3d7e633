"""Fixtures of real peers (PostgreSQL, the local broker, the local v3io server) live in tests/fixtures/.

End-to-end tests (marker ``e2e``) run a real ``dagster dev`` over hundreds of thousands of records; on a
2-core machine they take tens of minutes, so they run when asked: ``STREAMGROUP_E2E=1 bash scripts/test.sh``
(add ``-m e2e`` for them alone)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from dagster_streamgroup.dagster.resources import release_cached_clients
from tests import hypothesis_profiles  # noqa: F401  (the suite's hypothesis profile)

pytest_plugins = [
    "tests.fixtures.postgres",
    "tests.fixtures.kafka",
    "tests.fixtures.registry",
    "tests.fixtures.v3io",
    "tests.fixtures.spark_cluster",
]

E2E_ENV = "STREAMGROUP_E2E"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(E2E_ENV) == "1":
        return
    skip = pytest.mark.skip(
        reason=f"end-to-end test with a real dagster dev (tens of minutes on 2 cores): run with {E2E_ENV}=1"
    )
    for item in items:
        if item.get_closest_marker("e2e") is not None:  # not keywords: they hold the folder name too
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _release_clients() -> Iterator[None]:
    """Each test's cached clients end with it: one left to a broker or server that a test stopped would
    reconnect, and log a refused connection, for the rest of the session."""
    yield
    release_cached_clients()
