"""The patches of Dagster's internals run only on the Dagster releases they were verified on: on any other release
each stays off, Dagster keeps its own functions, one warning names the release, and nothing private is imported."""

from __future__ import annotations

import importlib
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as db
from alembic.script import ScriptDirectory
from dagster._config.pythonic_config import config as pythonic_config
from dagster._config.pythonic_config import resource as pythonic_resource
from dagster._core.storage import sql

from dagster_streamgroup import patches
from dagster_streamgroup.dagster import member_sensors
from dagster_streamgroup.patches import migrations, resource_schema, run_databases, schema_checks, sqlite_engines
from tests.dagster.helpers import counting_asset

UNVERIFIED = "1.13.99"
ROOT = Path(__file__).resolve().parents[2]


def test_the_dagster_the_project_locks_is_a_verified_release(caplog: pytest.LogCaptureFixture) -> None:
    """The suite runs on the locked Dagster: moving the lock to a release not listed fails here, so a release
    is added to the list only with a suite run on it."""
    assert patches.dagster_version() == dg.__version__
    assert patches.dagster_version() in patches.VERIFIED_DAGSTER_VERSIONS
    with caplog.at_level(logging.WARNING, logger=patches.__name__):
        assert patches.enabled()
    assert not caplog.records


@pytest.fixture
def unverified(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another Dagster release, with Dagster's own functions in place (earlier tests of this process may have
    installed the patches; monkeypatch puts them back afterwards)."""
    monkeypatch.setattr(patches, "dagster_version", lambda: UNVERIFIED)
    monkeypatch.setattr(patches, "_warned", set())
    monkeypatch.setattr(sql, "ScriptDirectory", ScriptDirectory)
    for name in migrations.SQLITE_STORAGE_MODULES:
        monkeypatch.setattr(importlib.import_module(name), "stamp_alembic_rev", sql.stamp_alembic_rev)
    dagsters_own = pythonic_config.infer_schema_from_config_class
    monkeypatch.setattr(pythonic_resource, "infer_schema_from_config_class", dagsters_own)
    for name in sqlite_engines.STORAGE_MODULES:
        monkeypatch.setattr(importlib.import_module(name), "create_engine", db.create_engine)
    for target in schema_checks.TARGETS:
        storage_class = target.storage_class()
        for name in target.methods:
            method = storage_class.__dict__[name]
            monkeypatch.setattr(storage_class, name, getattr(method, patches.ORIGINAL, method))
    run_storage = importlib.import_module(run_databases.MODULE).SqliteEventLogStorage
    initdb = run_storage.__dict__["_initdb"]
    monkeypatch.setattr(run_storage, "_initdb", getattr(initdb, patches.ORIGINAL, initdb))


def test_on_another_release_every_patch_stays_off_with_one_warning(
    unverified: None, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger=patches.__name__):
        assert not migrations.install()
        assert migrations.parse_once() is None
        assert not sqlite_engines.install()
        assert not resource_schema.install()
        assert not schema_checks.install()
        assert not run_databases.install()
        sensors = member_sensors(counting_asset("g_guard", []), members=2, heartbeat_interval_s=1)  # installs all
    assert len(sensors) == 2, "the definitions load"
    assert getattr(sql, "ScriptDirectory") is ScriptDirectory, "Dagster's schema check is its own"  # noqa: B009
    for name in migrations.SQLITE_STORAGE_MODULES:
        assert importlib.import_module(name).stamp_alembic_rev is sql.stamp_alembic_rev, "Dagster's stamp"
    dagsters_own = pythonic_config.infer_schema_from_config_class
    assert getattr(pythonic_resource, "infer_schema_from_config_class") is dagsters_own  # noqa: B009
    for name in sqlite_engines.STORAGE_MODULES:
        assert importlib.import_module(name).create_engine is db.create_engine
    for target in schema_checks.TARGETS:
        for name in target.methods:
            method = target.storage_class().__dict__[name]
            assert not hasattr(method, patches.ORIGINAL), f"{target.class_name}.{name} is Dagster's own"
    initdb = importlib.import_module(run_databases.MODULE).SqliteEventLogStorage.__dict__["_initdb"]
    assert not hasattr(initdb, patches.ORIGINAL), "Dagster builds each run database itself"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert UNVERIFIED in warnings[0] and "1.13.27" in warnings[0] and "stay off" in warnings[0]


PRIVATE_MODULES = (
    "dagster._core.storage.sql",
    "dagster._config.pythonic_config.config",
    "dagster._config.pythonic_config.resource",
    *sqlite_engines.STORAGE_MODULES,
    *migrations.SQLITE_STORAGE_MODULES,
    *schema_checks.STORAGE_MODULES,
    "dagster._core.storage.dagster_run",
    "dagster._utils.tags",
)
"""Every private Dagster module a patch touches."""


def test_on_another_release_nothing_private_is_imported() -> None:
    """A later Dagster may move or drop what the patches use: with every private module they touch made
    unimportable, the patch modules and the coordinator's configuration path import afresh and switching off
    raises nothing. A process of its own, where the package is imported first (Dagster imports some of those
    modules lazily itself) and then the patch modules again, with the private modules blocked."""
    script = textwrap.dedent(
        f"""
        import sys

        import dagster
        import dagster_streamgroup.dagster
        from dagster_streamgroup import patches

        patches.dagster_version = lambda: {UNVERIFIED!r}
        for name in list(sys.modules):
            if name.startswith("dagster_streamgroup.patches.") or name == "dagster_streamgroup.coordinator":
                del sys.modules[name]
        for name in {PRIVATE_MODULES!r}:
            sys.modules[name] = None
        from dagster_streamgroup.coordinator import MemberRunCoordinator
        from dagster_streamgroup.patches import migrations, resource_schema, run_databases, schema_checks
        from dagster_streamgroup.patches import sqlite_engines

        assert not migrations.install() and migrations.parse_once() is None
        assert not sqlite_engines.install() and not resource_schema.install()
        assert not schema_checks.install() and not run_databases.install()
        assert issubclass(MemberRunCoordinator, dagster.QueuedRunCoordinator)
        print("loaded")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "loaded"
    assert done.stderr.count(UNVERIFIED) == 1, f"one warning naming the release: {done.stderr[-2000:]}"
