"""Every configuration file ``docs/deploying.md`` shows lives in ``docs/deploying/`` and is loaded here.

- ``dagster-*.yaml``: validated by Dagster's own instance-config schema, then instantiated as a real
  ``DagsterInstance`` against the test PostgreSQL (storage and run coordinator; a run launcher whose package
  is installed, which Dagster's default is). An event written through it is read back from PostgreSQL.
- A launcher from a package that is not a dependency (``dagster_k8s``, ``dagster_docker``) has its
  configuration checked against that launcher's schema when the package is importable; otherwise that test
  is skipped and says so.
- ``definitions_*.py``: imported, their ``Definitions`` validated and every resource built with the
  environment variables set to test values (the group store's URL pointing at the test PostgreSQL, which
  the store then answers from).
"""

from __future__ import annotations

import importlib.util
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import dagster as dg
import psycopg
import pytest
import sqlalchemy.exc
import yaml  # type: ignore[import-untyped]
from dagster._config import validate_config
from dagster._core.instance.config import dagster_instance_config
from psycopg import sql
from sqlalchemy.engine import make_url

from dagster_streamgroup.dagster.devserver import ROOT
from dagster_streamgroup.stores.factory import open_store

DOCS = ROOT / "docs" / "deploying"
PAGE = ROOT / "docs" / "deploying.md"
INSTANCE_FILES = sorted(DOCS.glob("dagster-*.yaml"))
DEFINITIONS_FILES = sorted(DOCS.glob("definitions_*.py"))
PG_VARIABLES = ("DAGSTER_PG_HOST", "DAGSTER_PG_PORT", "DAGSTER_PG_DB", "DAGSTER_PG_USERNAME", "DAGSTER_PG_PASSWORD")
DEFAULT_LAUNCHER = ("dagster._core.launcher", "DefaultRunLauncher")


def load_yaml(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict)
    return data


def test_the_page_shows_only_tested_files() -> None:
    """The page names files of this folder instead of inlining configuration, and every file is loaded here."""
    text = PAGE.read_text()
    named = set(re.findall(r"docs/deploying/([\w.-]+)", text))
    on_disk = {p.name for p in DOCS.iterdir() if p.is_file()}
    assert named == on_disk, f"named on the page: {sorted(named)}; in docs/deploying/: {sorted(on_disk)}"
    assert on_disk == {p.name for p in [*INSTANCE_FILES, *DEFINITIONS_FILES]}, "a file no test here loads"
    inline = re.findall(r"^```(yaml|yml|python|py)\b", text, flags=re.MULTILINE)
    assert inline == [], "configuration inlined in docs/deploying.md: put it in docs/deploying/ and load it here"


# The instance files.


@pytest.fixture
def fake_pg_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PG_VARIABLES:
        monkeypatch.setenv(name, "5432" if name == "DAGSTER_PG_PORT" else f"test-{name.lower()}")


@pytest.mark.parametrize("path", INSTANCE_FILES, ids=lambda p: p.name)
def test_instance_file_passes_dagsters_schema(path: Path, fake_pg_env: None) -> None:
    config, custom_class = dagster_instance_config(str(path.parent), path.name)
    assert custom_class is None
    db = config["storage"]["postgres"]["postgres_db"]
    assert db["password"] == {"env": "DAGSTER_PG_PASSWORD"}  # read from the environment, never in the file
    assert db["scheme"] == "postgresql+psycopg2"
    assert set(db) >= {"hostname", "port", "db_name", "username"}


@pytest.mark.parametrize("path", INSTANCE_FILES, ids=lambda p: p.name)
def test_instance_file_keeps_the_examples_run_limits(path: Path) -> None:
    """One run per shard at a time is the product's guarantee: the same tag limits as ./dagster.yaml."""
    example = load_yaml(ROOT / "dagster.yaml")["run_coordinator"]
    documented = load_yaml(path)["run_coordinator"]
    assert (documented["module"], documented["class"]) == (example["module"], example["class"])
    limits = documented["config"]["tag_concurrency_limits"]
    assert limits == example["config"]["tag_concurrency_limits"]


@pytest.fixture
def instance_db(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh database on the test server, and the DAGSTER_PG_* variables pointing at it."""
    url = make_url(postgres_url)
    name = f"docs_{uuid.uuid4().hex[:12]}"
    admin = psycopg.conninfo.make_conninfo(
        host=url.host, port=url.port, user=url.username, password=url.password, dbname=url.database
    )
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    values = {
        "DAGSTER_PG_HOST": url.host,
        "DAGSTER_PG_PORT": str(url.port),
        "DAGSTER_PG_DB": name,
        "DAGSTER_PG_USERNAME": url.username,
        "DAGSTER_PG_PASSWORD": url.password,
    }
    for key, value in values.items():
        assert value is not None
        monkeypatch.setenv(key, value)
    yield admin.replace(f"dbname={url.database}", f"dbname={name}")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def instance_from(path: Path, home: Path) -> dg.DagsterInstance:
    """The file as ``$DAGSTER_HOME/dagster.yaml`` of a fresh home (the instance writes compute logs there)."""
    home.mkdir()
    (home / "dagster.yaml").write_text(path.read_text())
    return dg.DagsterInstance.from_config(str(home))


@pytest.mark.postgres
@pytest.mark.parametrize("path", INSTANCE_FILES, ids=lambda p: p.name)
def test_instance_file_runs_on_postgres(path: Path, instance_db: str, tmp_path: Path) -> None:
    from dagster._core.run_coordinator import QueuedRunCoordinator
    from dagster_postgres import PostgresEventLogStorage, PostgresRunStorage, PostgresScheduleStorage

    key = dg.AssetKey(["docs_deploying", path.stem.replace("-", "_")])
    with instance_from(path, tmp_path / "home") as instance:
        assert isinstance(instance.run_storage, PostgresRunStorage)
        assert isinstance(instance.event_log_storage, PostgresEventLogStorage)
        assert isinstance(instance.schedule_storage, PostgresScheduleStorage)
        assert isinstance(instance.run_coordinator, QueuedRunCoordinator)
        assert instance.get_runs_count() == 0
        instance.report_runless_asset_event(dg.AssetMaterialization(key, metadata={"file": path.name}))
        latest = instance.get_latest_materialization_event(key)
        assert latest is not None and latest.asset_materialization is not None
        launcher = instance.get_ref().run_launcher_data
        assert launcher is not None
        documented = load_yaml(path)["run_launcher"]
        assert (launcher.module_name, launcher.class_name) == (documented["module"], documented["class"])
        if (launcher.module_name, launcher.class_name) == DEFAULT_LAUNCHER:
            assert type(instance.run_launcher).__name__ == "DefaultRunLauncher"
    with psycopg.connect(instance_db) as conn:
        rows = conn.execute(
            "SELECT count(*) FROM event_logs WHERE dagster_event_type = 'ASSET_MATERIALIZATION' AND asset_key = %s",
            (key.to_string(),),
        ).fetchone()
    assert rows == (1,)


@pytest.mark.postgres
def test_bare_postgresql_scheme_breaks_event_writes(instance_db: str, tmp_path: Path) -> None:
    """Why every file sets ``scheme: postgresql+psycopg2``: without it SQLAlchemy 2.1 picks psycopg 3, and
    dagster-postgres's ``NOTIFY run_events, %(notify_id)s`` is a syntax error on every event write. When this
    test fails, dagster-postgres works with psycopg 3 and the scheme can go."""
    path = DOCS / "dagster-one-host.yaml"
    config = load_yaml(path)
    del config["storage"]["postgres"]["postgres_db"]["scheme"]
    bare = tmp_path / "bare.yaml"
    bare.write_text(yaml.safe_dump(config))
    with instance_from(bare, tmp_path / "home") as instance:
        materialization = dg.AssetMaterialization(dg.AssetKey("bare_scheme"))
        with pytest.raises(sqlalchemy.exc.ProgrammingError, match="NOTIFY run_events"):
            instance.report_runless_asset_event(materialization)


@pytest.mark.parametrize(
    "path",
    [p for p in INSTANCE_FILES if tuple(load_yaml(p)["run_launcher"].values())[:2] != DEFAULT_LAUNCHER],
    ids=lambda p: p.name,
)
def test_run_launcher_config_matches_its_launcher(path: Path, fake_pg_env: None) -> None:
    launcher = load_yaml(path)["run_launcher"]
    module = pytest.importorskip(
        launcher["module"], reason=f"{launcher['module']} is not a dependency; its launcher's schema is not checked"
    )
    launcher_class = getattr(module, launcher["class"])
    result = validate_config(launcher_class.config_type(), launcher["config"])
    assert result.success, [e.message for e in result.errors or []]


# The definitions files.

DEFINITIONS_ENV = {
    "definitions_kafka.py": {
        "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9093",
        "KAFKA_SASL_USERNAME": "clickstream",
        "KAFKA_SASL_PASSWORD": "sasl-secret-for-the-docs-test",
        "STREAMGROUP_STORE_URL": "",  # the test PostgreSQL, set by the test
        "SPARK_REMOTE": "sc://127.0.0.1:15002",
        "CLICKSTREAM_OUTPUT": "/tmp/clickstream",
    },
    "definitions_v3io.py": {
        "V3IO_API": "http://127.0.0.1:8081",
        "V3IO_ACCESS_KEY_FILE": "",  # a file written by the test
        "SPARK_MASTER": "spark://127.0.0.1:7077",
        "CLICKSTREAM_OUTPUT": "/tmp/clickstream",
    },
}


def import_file(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"docs_deploying_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_definitions_file_has_test_values() -> None:
    assert set(DEFINITIONS_ENV) == {p.name for p in DEFINITIONS_FILES}
    for path in DEFINITIONS_FILES:
        found = re.findall(r"""(?:EnvVar\(|os\.environ\[)["'](\w+)["']""", path.read_text())
        used = set(found)
        assert used == set(DEFINITIONS_ENV[path.name]), path.name


@pytest.mark.postgres
@pytest.mark.parametrize("path", DEFINITIONS_FILES, ids=lambda p: p.name)
def test_definitions_file_resolves(
    path: Path, postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = dict(DEFINITIONS_ENV[path.name])
    if "STREAMGROUP_STORE_URL" in env:
        env["STREAMGROUP_STORE_URL"] = postgres_url
    if "V3IO_ACCESS_KEY_FILE" in env:
        key_file = tmp_path / "v3io-access-key"
        key_file.write_text("v3io-key-for-the-docs-test\n")
        env["V3IO_ACCESS_KEY_FILE"] = str(key_file)
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    defs = import_file(path).defs
    assert isinstance(defs, dg.Definitions)
    dg.Definitions.validate_loadable(defs)
    repo = defs.get_repository_def()
    assert dg.AssetKey("page_views") in repo.assets_defs_by_key
    assert len(repo.sensor_defs) == 3
    with dg.build_resources(repo.get_top_level_resources()) as resources:
        group, spark = resources.streamgroup, resources.pyspark
        shown = repr(group) + repr(spark)
        for name, value in env.items():
            if "PASSWORD" in name or "STORE_URL" in name:
                assert value not in shown, f"{name} shows in a resource's repr"
        if path.name == "definitions_kafka.py":
            assert group.bootstrap_servers == env["KAFKA_BOOTSTRAP_SERVERS"]
            assert group.sasl_password == env["KAFKA_SASL_PASSWORD"]
            assert spark.remote == env["SPARK_REMOTE"]
            assert group.store_url == postgres_url
            store = open_store(group.store_url)
            try:
                assert store.now() > 0  # the server's clock: the URL from the environment reaches PostgreSQL
            finally:
                store.close()
        else:
            assert group.endpoint == env["V3IO_API"]
            assert group.access_key_file == env["V3IO_ACCESS_KEY_FILE"]
            assert group.store_url == "v3io"
            assert spark.master == env["SPARK_MASTER"]
