"""The temporary PostgreSQL: loopback only, never root, and nothing left behind."""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from dagster_streamgroup.local.postgres import server_env, temporary_postgres

pytestmark = pytest.mark.postgres


def _connect(url: str) -> psycopg.Connection[tuple[object, ...]]:
    u = make_url(url)
    return psycopg.connect(host=u.host, port=u.port, user=u.username, password=u.password, dbname=u.database)


def _uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid in /proc/{pid}/status")


def test_server_listens_on_loopback_and_runs_as_a_non_root_user(postgres_url: str) -> None:
    assert make_url(postgres_url).host == "127.0.0.1"
    with _connect(postgres_url) as conn:  # the backend process lives as long as its connection
        row = conn.execute("SELECT current_setting('listen_addresses'), pg_backend_pid()").fetchone()
        assert row is not None
        listen, backend_pid = row
        assert listen == "127.0.0.1"
        assert isinstance(backend_pid, int)
        backend_uid = _uid(backend_pid)
    assert backend_uid != 0
    if os.geteuid() == 0:
        import pwd

        assert backend_uid == pwd.getpwnam("postgres").pw_uid


def test_exit_stops_the_server_and_removes_its_directory(postgres_url: str) -> None:
    # postgres_url only makes sure the binaries exist (it skips otherwise); this test needs its own server.
    with temporary_postgres(durable=False) as url, _connect(url) as conn:
        row = conn.execute("SELECT current_setting('data_directory')").fetchone()
        assert row is not None
        data_dir = Path(str(row[0]))
        postmaster_pid = int((data_dir / "postmaster.pid").read_text().splitlines()[0])
        assert Path(f"/proc/{postmaster_pid}").exists()
    assert not Path(f"/proc/{postmaster_pid}").exists()
    assert not data_dir.parent.exists()


POSTGRES_OWN_VARIABLES = {
    *("PGDATA", "PG_GRANDPARENT_PID", "PGLOCALEDIR", "PGSYSCONFDIR", "PWD", "OLDPWD", "SHLVL", "_"),
    *("LC_COLLATE", "LC_CTYPE", "LC_MESSAGES", "LC_MONETARY", "LC_NUMERIC", "LC_TIME"),
}
"""What the server (its locale settings in place of ``LC_ALL``) and the shell that runs a program for it set."""


def test_the_server_gets_only_the_environment_it_needs(postgres_url: str) -> None:
    """initdb and postgres run as another OS user and need none of the passwords our environment may hold (the
    Dagster instance's, a store URL's, a SASL password). Read as the server has it: the superuser runs ``env``
    in the server's environment (``COPY ... FROM PROGRAM``); ``/proc/PID/environ`` of a PostgreSQL process is
    overwritten by its process title."""
    with _connect(postgres_url) as conn:
        conn.execute("CREATE TEMP TABLE server_env (line text)")
        conn.execute("COPY server_env FROM PROGRAM 'env'")
        lines = [str(row[0]) for row in conn.execute("SELECT line FROM server_env").fetchall()]
    variables = {line.partition("=")[0] for line in lines if "=" in line}
    assert "PATH" in variables and "LANG=C" in lines, lines
    assert variables <= {*server_env(), *POSTGRES_OWN_VARIABLES}, sorted(variables)  # none of ours but those
