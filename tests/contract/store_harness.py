"""The stores the contract tests run against, and how to plant a row that the store itself would never write.

To add a store: write a builder and add it to ``BUILDERS`` and ``PARAMS`` (with the marker of the server it
needs). ``put_raw`` writes a body the way another program sharing the storage would; ``read_raw`` returns
what is stored, to check that a refused object was left byte-for-byte untouched. A store that can only
hold what it encoded itself leaves both as None and the foreign-object tests skip it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import v3io.dataplane
from sqlalchemy import create_engine, insert, select

from dagster_streamgroup.local.v3io.testing import V3ioServerInfo
from dagster_streamgroup.stores.base import StateStore
from dagster_streamgroup.stores.factory import open_store
from dagster_streamgroup.stores.memory import MemoryStore
from dagster_streamgroup.stores.sql import DEFAULT_TABLE, SqlStateStore, state_table
from dagster_streamgroup.stores.v3io import KIND, SCHEMA, STATE, V3ioStateStore, state_location


@dataclass
class StoreHarness:
    name: str
    store: StateStore
    put_raw: Callable[[str, str], None] | None = None
    read_raw: Callable[[str], str | None] | None = None
    cleanup: Callable[[], None] | None = None


def _sql_harness(name: str, url: str) -> StoreHarness:
    store = open_store(url)
    assert isinstance(store, SqlStateStore)
    table = state_table(DEFAULT_TABLE)
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))

    def put_raw(key: str, body: str) -> None:
        # Another writer sharing the table: the row's columns describe what it wrote.
        try:
            raw = json.loads(body)
        except ValueError:
            raw = None
        kind = str(raw.get("kind", "foreign")) if isinstance(raw, dict) else "foreign"
        schema = raw.get("schema_version", 0) if isinstance(raw, dict) else 0
        with engine.begin() as conn:
            conn.execute(
                insert(table).values(
                    key=key, version=1, kind=kind, schema_version=int(schema) if isinstance(schema, int) else 0,
                    body=body,
                )
            )  # fmt: skip

    def read_raw(key: str) -> str | None:
        with engine.connect() as conn:
            body: str | None = conn.execute(select(table.c.body).where(table.c.key == key)).scalar_one_or_none()
            return body

    def cleanup() -> None:
        engine.dispose()

    return StoreHarness(name, store, put_raw, read_raw, cleanup)


def memory(request: pytest.FixtureRequest, tmp_path: Path) -> StoreHarness:
    return StoreHarness("memory", MemoryStore(time.time))


def sqlite(request: pytest.FixtureRequest, tmp_path: Path) -> StoreHarness:
    return _sql_harness("sqlite", f"sqlite:///{tmp_path / 'state' / 'groups.db'}")


def postgresql(request: pytest.FixtureRequest, tmp_path: Path) -> StoreHarness:
    return _sql_harness("postgresql", request.getfixturevalue("postgres_url"))


def v3io_kv(request: pytest.FixtureRequest, tmp_path: Path) -> StoreHarness:
    server: V3ioServerInfo = request.getfixturevalue("v3io_server")
    key_file = tmp_path / "v3io-access-key"
    key_file.write_text(server.access_key.get_secret_value())
    store = open_store(f"v3io://127.0.0.1:{server.port}/bigdata?access_key_file={key_file}")
    assert isinstance(store, V3ioStateStore)
    client = v3io.dataplane.Client(**server.client_kwargs())

    def put_raw(key: str, body: str) -> None:
        # Another writer of the same item: v3io-go puts its document in `state`; a (newer) dagster-streamgroup
        # also marks the item with the kind and schema of what it wrote.
        try:
            raw = json.loads(body)
        except ValueError:
            raw = None
        attributes: dict[str, object] = {STATE: body}
        if isinstance(raw, dict) and isinstance(raw.get("kind"), str) and isinstance(raw.get("schema_version"), int):
            attributes.update({KIND: raw["kind"], SCHEMA: raw["schema_version"]})
        container, directory, item = state_location(key, "bigdata", store.directory)
        client.kv.update(container, directory, item, attributes=attributes, condition=f"not(exists({STATE}))")

    def read_raw(key: str) -> str | None:
        container, directory, item = state_location(key, "bigdata", store.directory)
        response = client.kv.get(
            container, directory, item, attribute_names=[STATE], raise_for_status=v3io.dataplane.RaiseForStatus.never
        )
        if response.status_code == 404:
            return None
        value = response.output.item.get(STATE)
        return value if isinstance(value, str) else None

    return StoreHarness("v3io", store, put_raw, read_raw, client.close)


BUILDERS: dict[str, Callable[[pytest.FixtureRequest, Path], StoreHarness]] = {
    "memory": memory,
    "sqlite": sqlite,
    "postgresql": postgresql,
    "v3io": v3io_kv,
}

PARAMS = [
    pytest.param("memory"),
    pytest.param("sqlite"),
    pytest.param("postgresql", marks=pytest.mark.postgres),
    pytest.param("v3io", marks=pytest.mark.v3io),
]
