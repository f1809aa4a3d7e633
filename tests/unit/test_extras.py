"""An optional dependency that is not installed fails with the extra that brings it, not a bare import error."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from dagster_streamgroup.cli import main
from dagster_streamgroup.dagster import KafkaStreamGroup
from dagster_streamgroup.extras import MissingExtraError, missing_extra, require


def uninstalled(monkeypatch: pytest.MonkeyPatch, module: str, *importers: str) -> None:
    """``module`` unimportable, and the modules that import it imported afresh (monkeypatch restores both)."""
    monkeypatch.setitem(sys.modules, module, None)
    for name in importers:
        monkeypatch.delitem(sys.modules, name, raising=False)


def test_the_error_names_the_extra_and_is_an_import_error() -> None:
    error = missing_extra("uvicorn", "local", "the local v3io server")
    assert isinstance(error, ImportError) and error.name == "uvicorn"
    assert str(error) == "the local v3io server needs 'uvicorn', which is not installed: " + (
        "pip install 'dagster-streamgroup[local]'"
    )
    require("click", "local", "nothing")  # installed: no error


def test_streamgroup_local_v3io_says_which_extra_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    uninstalled(monkeypatch, "uvicorn", "dagster_streamgroup.local.v3io.server", "dagster_streamgroup.local.v3io.wire")
    result = CliRunner().invoke(main, ["local", "v3io", "--data", str(tmp_path)])
    assert result.exit_code == 1, result.output
    assert "pip install 'dagster-streamgroup[local]'" in result.output
    assert "Traceback" not in result.output


def test_a_postgresql_state_store_without_psycopg_names_the_postgres_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    uninstalled(monkeypatch, "psycopg")
    resource = KafkaStreamGroup(
        group="g", bootstrap_servers="127.0.0.1:9092", topics=["t"], store_url="postgresql://u@127.0.0.1:1/db"
    )
    with pytest.raises(MissingExtraError, match=r"pip install 'dagster-streamgroup\[postgres\]'"):
        resource.store()


def test_the_local_postgres_helpers_name_the_postgres_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    uninstalled(
        monkeypatch, "psycopg", "dagster_streamgroup.local.postgres", "dagster_streamgroup.local.dagster_storage"
    )
    with pytest.raises(MissingExtraError, match=r"dagster-streamgroup\[postgres\]"):
        import dagster_streamgroup.local.dagster_storage  # noqa: F401
