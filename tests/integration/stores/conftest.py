"""The SQL log store's tests run on SQLite and on the session's PostgreSQL, each under a key of its own."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest


@pytest.fixture
def key() -> str:
    """Unique per test: the PostgreSQL database is shared by the session's tests."""
    return f"stream|g-{uuid.uuid4().hex[:8]}"


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'state.db'}"
    return str(request.getfixturevalue("postgres_url"))
