"""``DAGSTER_STORAGE``: its values, the instance file composed from ./dagster.yaml, the instance database's role
on a real PostgreSQL, and the server process ``scripts/example.sh`` keeps."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
import yaml  # type: ignore[import-untyped]
from dagster._core.instance.config import dagster_instance_config
from sqlalchemy.engine import make_url

from dagster_streamgroup.dagster.devserver import ROOT, DagsterDev
from dagster_streamgroup.local.dagster_storage import (
    PASSWORD_ENV,
    STORAGE_ENV,
    DagsterStorageError,
    PostgresInstanceDb,
    compose_instance_yaml,
    provision_database,
    storage_kind,
)
from dagster_streamgroup.local.postgres import PostgresNotFoundError, find_server_binaries
from tests.fixtures.required import missing as required_missing

DB = PostgresInstanceDb(hostname="127.0.0.1", port=5433, db_name="dagster", username="dagster")


@pytest.mark.parametrize(
    ("value", "kind"), [(None, "sqlite"), ("", "sqlite"), ("sqlite", "sqlite"), ("postgres", "postgres")]
)
def test_storage_kind(value: str | None, kind: str) -> None:
    assert storage_kind(value) == kind


@pytest.mark.parametrize("value", ["postgresql", "Postgres", "mysql", " sqlite", "pg"])
def test_storage_kind_refuses_other_values(value: str) -> None:
    with pytest.raises(DagsterStorageError, match=rf"^{STORAGE_ENV}: must be 'sqlite' or 'postgres'.*got {value!r}"):
        storage_kind(value)


def test_composed_file_is_the_base_plus_storage() -> None:
    base_text = (ROOT / "dagster.yaml").read_text()
    composed = compose_instance_yaml(base_text, DB.storage_config())
    assert composed.startswith(base_text)  # comments and layout of the base kept as they are
    base, result = yaml.safe_load(base_text), yaml.safe_load(composed)
    assert result == {**base, "storage": DB.storage_config()}
    db = result["storage"]["postgres"]["postgres_db"]
    assert db["password"] == {"env": PASSWORD_ENV}
    assert db["scheme"] == "postgresql+psycopg2"
    assert compose_instance_yaml(base_text, None) == base_text


def test_composed_file_passes_dagsters_schema(tmp_path: Path) -> None:
    (tmp_path / "dagster.yaml").write_text(
        compose_instance_yaml((ROOT / "dagster.yaml").read_text(), DB.storage_config())
    )
    config, _ = dagster_instance_config(str(tmp_path))
    assert config["storage"]["postgres"]["postgres_db"]["port"] == 5433
    assert config["run_coordinator"] == yaml.safe_load((ROOT / "dagster.yaml").read_text())["run_coordinator"]


@pytest.mark.parametrize("key", ["storage", "run_storage", "event_log_storage", "schedule_storage"])
def test_a_base_with_storage_is_refused(key: str) -> None:
    with pytest.raises(DagsterStorageError, match=rf"base.yaml: already configures {key}"):
        compose_instance_yaml(f"{key}:\n  sqlite:\n    base_dir: /x\n", DB.storage_config(), source="base.yaml")


@pytest.mark.parametrize(
    ("text", "reason"),
    [("- a\n- b\n", "must be a mapping of instance settings, got list"), ("a: [\n", "not valid YAML")],
)
def test_a_base_that_is_not_an_instance_file_is_refused(text: str, reason: str) -> None:
    with pytest.raises(DagsterStorageError, match=rf"base.yaml: {reason}"):
        compose_instance_yaml(text, DB.storage_config(), source="base.yaml")


def test_the_harness_refuses_a_bad_value_before_writing(tmp_path: Path) -> None:
    with pytest.raises(DagsterStorageError, match=f"{STORAGE_ENV}: must be"):
        DagsterDev(tmp_path / "home", {STORAGE_ENV: "mysql"}, tmp_path / "log")
    assert not (tmp_path / "home").exists()


def test_the_example_refuses_a_bad_value_at_once() -> None:
    result = subprocess.run(
        ["bash", str(ROOT / "scripts/example.sh")],
        env={**os.environ, STORAGE_ENV: "postgresql"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "example: DAGSTER_STORAGE must be sqlite or postgres (default sqlite), got 'postgresql'" in result.stderr
    assert "setup:" not in result.stdout + result.stderr  # refused before any set-up


@pytest.mark.postgres
def test_the_instance_role_logs_in_with_its_password_and_is_no_superuser(postgres_url: str) -> None:
    password = "a-password-only-the-instance-knows"
    url = make_url(postgres_url)
    db = provision_database(postgres_url, password, role="dagster_test_role", database="dagster_test_db")
    assert (db.hostname, db.port) == (url.host, url.port)
    conninfo = psycopg.conninfo.make_conninfo(
        host=db.hostname, port=db.port, user=db.username, password=password, dbname=db.db_name
    )
    with psycopg.connect(conninfo) as conn:
        row = conn.execute("SELECT current_user, rolsuper, rolcreatedb FROM pg_roles WHERE rolname = current_user")
        assert row.fetchone() == ("dagster_test_role", False, False)
        conn.execute("CREATE TABLE owned_by_the_role (x int)")  # it owns its database
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(conninfo.replace(password, "wrong-password")).close()
    admin = psycopg.conninfo.make_conninfo(
        host=url.host, port=url.port, user=url.username, password=url.password, dbname=url.database
    )
    with psycopg.connect(admin) as conn:
        stored = conn.execute("SELECT rolpassword FROM pg_authid WHERE rolname = 'dagster_test_role'").fetchone()
    assert stored is not None and stored[0].startswith("SCRAM-SHA-256$") and password not in stored[0]


@pytest.mark.postgres
@pytest.mark.parametrize("role", ["Dagster", "dagster; DROP", ""])
def test_provision_refuses_names_that_are_not_plain(postgres_url: str, role: str) -> None:
    with pytest.raises(DagsterStorageError, match=r"role: .* is not a plain lower-case PostgreSQL name"):
        provision_database(postgres_url, "pw", role=role)


def port_answers(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.postgres
def test_the_examples_server_process(tmp_path: Path) -> None:
    """What scripts/example.sh starts: the file appears once the database is ready, the password is in no
    output, and SIGINT stops the server."""
    try:
        find_server_binaries()
    except PostgresNotFoundError as exc:
        required_missing("postgres", f"PostgreSQL server binaries not found: {exc}")
    command = [sys.executable, "-m", "dagster_streamgroup.local.dagster_storage", "--home", str(tmp_path / "home")]
    command += ["--base", str(ROOT / "dagster.yaml")]
    missing = subprocess.run(
        command,
        env={k: v for k, v in os.environ.items() if k != PASSWORD_ENV},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert missing.returncode == 2 and f"{PASSWORD_ENV} is not set" in missing.stderr

    password = "the-example-password-for-this-test"
    proc = subprocess.Popen(
        command, env={**os.environ, PASSWORD_ENV: password}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        target = tmp_path / "home" / "dagster.yaml"
        deadline = time.monotonic() + 60
        while not target.exists():
            assert proc.poll() is None, "the server process exited"
            assert time.monotonic() < deadline, "no dagster.yaml within 60 s"
            time.sleep(0.1)
        db = yaml.safe_load(target.read_text())["storage"]["postgres"]["postgres_db"]
        conninfo = psycopg.conninfo.make_conninfo(
            host=db["hostname"], port=db["port"], user=db["username"], password=password, dbname=db["db_name"]
        )
        with psycopg.connect(conninfo) as conn:
            assert conn.execute("SELECT current_database()").fetchone() == ("dagster",)
        assert password not in target.read_text()
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0
    assert b"instance on PostgreSQL" in output and password.encode() not in output
    assert not port_answers(db["port"])
