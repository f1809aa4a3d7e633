"""open_store: one URL string picks the store; bad URLs name the configuration field and the choices."""

from __future__ import annotations

from pathlib import Path

import pytest

from dagster_streamgroup.stores.base import StateStore, StoreConfigError
from dagster_streamgroup.stores.factory import open_store
from dagster_streamgroup.stores.memory import MemoryStore
from dagster_streamgroup.stores.sql import SqlStateStore


def test_sqlite_url_opens_a_sql_store_and_creates_the_directory(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'a' / 'b' / 'state.db'}")
    try:
        assert isinstance(store, SqlStateStore)
        assert isinstance(store, StateStore)
        assert (tmp_path / "a" / "b").is_dir()
    finally:
        store.close()


def test_memory_url_opens_an_independent_memory_store() -> None:
    one, two = open_store("memory://"), open_store("memory://")
    assert isinstance(one, MemoryStore) and isinstance(two, MemoryStore)
    assert one is not two


@pytest.mark.parametrize("url", ["kafka://broker:9092/x", "s3://bucket/state", "/var/lib/state.db", ""])
def test_unknown_scheme_names_the_field_and_lists_the_choices(url: str) -> None:
    with pytest.raises(StoreConfigError) as refused:
        open_store(url, field="state_store_url")
    message = str(refused.value)
    assert message.startswith("state_store_url: ")
    for scheme in ("sqlite:///", "postgresql://", "memory://"):
        assert scheme in message


def test_unknown_scheme_error_hides_the_password() -> None:
    with pytest.raises(StoreConfigError) as refused:
        open_store("mysql://user:hunter2@db/state")
    assert "hunter2" not in str(refused.value)


def test_v3io_url_goes_to_the_v3io_store_and_its_errors_name_the_field(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("V3IO_ACCESS_KEY", raising=False)
    with pytest.raises(StoreConfigError, match=r"^store_url: .*access_key"):
        open_store("v3io://127.0.0.1:1/container/streams")


def test_bad_sqlite_url_is_reported_against_the_field() -> None:
    with pytest.raises(StoreConfigError, match=r"^group_state: .*file path"):
        open_store("sqlite://", field="group_state")
