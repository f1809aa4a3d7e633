"""A real ``dagster dev`` whose instance lives in PostgreSQL (``DagsterDev(storage="postgres")``, the option
``DAGSTER_STORAGE=postgres`` selects for the example and the end-to-end test).

Its daemons heartbeat and its webserver answers; a run launched through GraphQL is queued, dequeued by the
daemon and succeeds, and its events are rows of PostgreSQL's ``event_logs``; after ``dagster dev`` is
stopped and started again, the run is still there. No SQLite storage is created in ``DAGSTER_HOME``, and the
database password appears in no file, log line or table row. The code location is the one-asset
``tests/deploying/definitions.py``, so the whole test takes about a minute."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from dagster_streamgroup.dagster.devserver import DagsterDev, wait_for
from dagster_streamgroup.local.dagster_storage import PASSWORD_ENV
from dagster_streamgroup.local.postgres import PostgresNotFoundError, find_server_binaries
from tests.fixtures.required import missing

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.timeout(600)]

HERE = Path(__file__).resolve().parent
LOCATION = "deploying"
JOB = "greeting_job"

LAUNCH = """mutation($p: ExecutionParams!) { launchRun(executionParams: $p) { __typename
  ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }"""
DAEMONS = "{ instance { daemonHealth { allDaemonStatuses { daemonType healthy required } } } }"


@pytest.fixture
def work_dir() -> Iterator[Path]:
    try:
        find_server_binaries()
    except PostgresNotFoundError as exc:
        missing("postgres", f"PostgreSQL server binaries not found (Debian's postgresql package): {exc}")
    with tempfile.TemporaryDirectory(prefix="streamgroup-deploying-") as tmp:
        yield Path(tmp)


def pg_connect(dev: DagsterDev) -> psycopg.Connection[tuple[Any, ...]]:
    return psycopg.connect(dev.storage.sqlalchemy_url().replace("postgresql+psycopg://", "postgresql://"))


def launch(dev: DagsterDev) -> str:
    selector = {"repositoryLocationName": LOCATION, "repositoryName": "__repository__", "jobName": JOB}
    result = dev.graphql(LAUNCH, {"p": {"selector": selector, "runConfigData": {}}})["launchRun"]
    assert result["__typename"] == "LaunchRunSuccess", result
    run_id = result["run"]["runId"]
    assert isinstance(run_id, str)
    return run_id


def required_daemons_healthy(dev: DagsterDev) -> set[str] | None:
    statuses = dev.graphql(DAEMONS)["instance"]["daemonHealth"]["allDaemonStatuses"]
    required = [s for s in statuses if s["required"]]
    return {s["daemonType"] for s in required} if required and all(s["healthy"] for s in required) else None


def run_status(dev: DagsterDev, run_id: str) -> str | None:
    status = {r["runId"]: r["status"] for r in dev.runs()}.get(run_id)
    return status if status in {"SUCCESS", "FAILURE", "CANCELED"} else None


def rows_holding(conn: psycopg.Connection[tuple[Any, ...]], needle: str) -> list[str]:
    """``table.column`` of every text column of the instance's tables with a value containing ``needle``."""
    columns = conn.execute(
        "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = 'public' "
        "AND data_type IN ('text', 'character varying')"
    ).fetchall()
    found = []
    for table, column in columns:
        query = sql.SQL("SELECT count(*) FROM {} WHERE strpos({}, %s) > 0").format(
            sql.Identifier(table), sql.Identifier(column)
        )
        row = conn.execute(query, (needle,)).fetchone()
        if row is not None and row[0]:
            found.append(f"{table}.{column}")
    return found


def test_dagster_dev_on_postgres(work_dir: Path) -> None:
    home = work_dir / "home"
    log = work_dir / "dagster-dev.log"
    with DagsterDev(home, {}, log, storage="postgres", workspace=HERE / "workspace.yaml") as dev:
        assert dev.storage.kind == "postgres" and dev.storage.database is not None
        password = dev.storage.env[PASSWORD_ENV]
        assert dev.env[PASSWORD_ENV] == password
        instance_yaml = (home / "dagster.yaml").read_text()
        assert "env: DAGSTER_PG_PASSWORD" in instance_yaml

        dev.start()
        daemons = wait_for("every required daemon to be healthy", lambda: required_daemons_healthy(dev), 120.0)
        assert {"SENSOR", "QUEUED_RUN_COORDINATOR"} <= daemons

        run_id = launch(dev)
        assert wait_for("the run to end", lambda: run_status(dev, run_id), 240.0) == "SUCCESS"

        with pg_connect(dev) as conn:
            (status,) = conn.execute("SELECT status FROM runs WHERE run_id = %s", (run_id,)).fetchone() or (None,)
            assert status == "SUCCESS"
            events = {
                event_type
                for (event_type,) in conn.execute(
                    "SELECT dagster_event_type FROM event_logs WHERE run_id = %s", (run_id,)
                ).fetchall()
            }
            assert {"PIPELINE_ENQUEUED", "PIPELINE_STARTING", "PIPELINE_SUCCESS", "ASSET_MATERIALIZATION"} <= events
            (materialized,) = conn.execute(
                "SELECT count(*) FROM event_logs WHERE run_id = %s AND dagster_event_type = 'ASSET_MATERIALIZATION'"
                " AND asset_key = %s",
                (run_id, '["greeting"]'),
            ).fetchone() or (0,)
            assert materialized == 1
            heartbeats = {d for (d,) in conn.execute("SELECT daemon_type FROM daemon_heartbeats").fetchall()}
            assert daemons <= heartbeats

        # The instance outlives dagster dev: stopped and started again, it still lists the run.
        dev.stop()
        dev.start()
        assert {r["runId"]: r["status"] for r in dev.runs()}.get(run_id) == "SUCCESS"

        with pg_connect(dev) as conn:
            assert rows_holding(conn, password) == []
    sqlite = [p.name for p in [home / "history", home / "schedules", *home.rglob("*.db")] if p.exists()]
    assert sqlite == [], f"SQLite storage was created in DAGSTER_HOME: {sqlite}"
    written = [p for p in [log, *home.rglob("*")] if p.is_file() and password.encode() in p.read_bytes()]
    assert written == [], f"the database password is written in {written}"
