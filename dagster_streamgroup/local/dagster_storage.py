"""Where the Dagster instance of the example and of the ``dagster dev`` harness keeps its runs, events and
schedules: SQLite files in ``$DAGSTER_HOME`` (Dagster's default) or PostgreSQL, chosen by ``DAGSTER_STORAGE``.

PostgreSQL is the project's temporary server (``local.postgres``: 127.0.0.1, a free port, stopped by PID),
with a database and a login role of its own for the instance, as a production deployment has. The
instance's ``dagster.yaml`` is the project's file with a ``storage:`` block appended, so whatever else that
file sets (run coordinator, limits, monitoring, run launcher) is used as it is. The role's password is read
by every Dagster process from ``$DAGSTER_PG_PASSWORD`` (``{env: DAGSTER_PG_PASSWORD}`` in the file): it is
never written to the file, the command line or a log, and the server receives only its SCRAM verifier.

``python -m dagster_streamgroup.local.dagster_storage --home DIR --base dagster.yaml`` keeps such a server
for ``scripts/example.sh`` until SIGINT or SIGTERM, with the password taken from ``$DAGSTER_PG_PASSWORD``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import secrets
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Literal

import yaml  # type: ignore[import-untyped]  # no types-PyYAML in the lock: yaml is a dependency of dagster
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.engine import URL, make_url

from dagster_streamgroup.extras import missing_extra

try:
    import psycopg
    from psycopg import sql
except ImportError as exc:
    raise missing_extra("psycopg", "postgres", "the Dagster instance on PostgreSQL") from exc

from dagster_streamgroup.local.postgres import temporary_postgres

StorageKind = Literal["sqlite", "postgres"]
STORAGE_KINDS: tuple[StorageKind, ...] = ("sqlite", "postgres")
STORAGE_ENV = "DAGSTER_STORAGE"
"""The variable that selects the instance storage of the example and the harness."""
PASSWORD_ENV = "DAGSTER_PG_PASSWORD"
"""The variable every Dagster process reads the instance database's password from (the name the Dagster
Helm chart also uses)."""
PSYCOPG2_SCHEME = "postgresql+psycopg2"
"""The SQLAlchemy URL scheme dagster-postgres must be given: SQLAlchemy 2.1 maps a bare ``postgresql://`` to
psycopg 3, whose server-side parameters break dagster-postgres's ``NOTIFY run_events, %(notify_id)s``
(a syntax error on every event write); dagster-postgres is written for psycopg2, which it installs."""
INSTANCE_ROLE = "dagster"
INSTANCE_DATABASE = "dagster"
_STORAGE_KEYS = ("storage", "run_storage", "event_log_storage", "schedule_storage")
_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class DagsterStorageError(ValueError):
    """A bad ``DAGSTER_STORAGE`` value, or a base ``dagster.yaml`` the storage block cannot be added to."""


# Pure: the choice of storage and the instance configuration text.


def storage_kind(value: str | None) -> StorageKind:
    """``DAGSTER_STORAGE``: unset or empty means ``sqlite``; anything but the two names is refused."""
    if value is None or value == "":
        return "sqlite"
    for kind in STORAGE_KINDS:
        if value == kind:
            return kind
    choices = " or ".join(repr(k) for k in STORAGE_KINDS)
    raise DagsterStorageError(f"{STORAGE_ENV}: must be {choices} (default 'sqlite'), got {value!r}")


class PostgresInstanceDb(BaseModel):
    """Where the instance's tables live; the password is not part of it."""

    model_config = ConfigDict(frozen=True)

    hostname: str = Field(description="The server's host name or address.")
    port: int = Field(ge=1, le=65535, description="The server's port.")
    db_name: str = Field(description="The database that holds the instance's tables.")
    username: str = Field(description="The login role Dagster connects as.")

    def storage_config(self, password_env: str = PASSWORD_ENV) -> dict[str, Any]:
        """The ``storage:`` value of ``dagster.yaml``: ``postgres_db`` with the password from the environment."""
        return {
            "postgres": {
                "postgres_db": {
                    "username": self.username,
                    "password": {"env": password_env},
                    "hostname": self.hostname,
                    "db_name": self.db_name,
                    "port": self.port,
                    "scheme": PSYCOPG2_SCHEME,
                }
            }
        }


def compose_instance_yaml(base_text: str, storage: Mapping[str, Any] | None, source: str = "dagster.yaml") -> str:
    """``base_text`` unchanged, with a ``storage:`` block appended when one is given.

    Appending (rather than parsing and dumping) keeps the base file's comments and layout, and a base that
    already configures storage is refused instead of one of the two being silently dropped."""
    try:
        base = yaml.safe_load(base_text)
    except yaml.YAMLError as exc:
        raise DagsterStorageError(f"{source}: not valid YAML: {exc}") from None
    if base is None:
        base = {}
    if not isinstance(base, dict):
        raise DagsterStorageError(f"{source}: must be a mapping of instance settings, got {type(base).__name__}")
    if storage is None:
        return base_text
    clash = [key for key in _STORAGE_KEYS if key in base]
    if clash:
        raise DagsterStorageError(
            f"{source}: already configures {', '.join(clash)}; {STORAGE_ENV}=postgres adds its own storage block, "
            "so remove those keys from the base file"
        )
    block: str = yaml.safe_dump({"storage": dict(storage)}, sort_keys=False, default_flow_style=False)
    head = base_text if base_text.endswith("\n") or not base_text else base_text + "\n"
    note = (
        f"# Added for {STORAGE_ENV}=postgres: runs, events and schedules in PostgreSQL. Every Dagster process\n"
        f"# reads the password from the environment; it is not written here.\n"
    )
    return head + note + block


# I/O: the server, the instance's database, the file.


def provision_database(
    admin_url: str, password: str, role: str = INSTANCE_ROLE, database: str = INSTANCE_DATABASE
) -> PostgresInstanceDb:
    """A login role and a database it owns, created through ``admin_url`` (a superuser).

    Only the SCRAM verifier of ``password``, computed by libpq on this side, reaches the server: the
    password is in no statement the server could log."""
    for what, name in (("role", role), ("database", database)):
        if not _NAME.match(name):
            raise DagsterStorageError(f"{what}: {name!r} is not a plain lower-case PostgreSQL name")
    if not password:
        raise DagsterStorageError(f"{PASSWORD_ENV}: the instance database's password must not be empty")
    url = make_url(admin_url)
    conninfo = psycopg.conninfo.make_conninfo(
        host=url.host, port=url.port, user=url.username, password=url.password, dbname=url.database,
        connect_timeout=10,
    )  # fmt: skip
    with psycopg.connect(conninfo, autocommit=True) as conn:
        verifier = conn.pgconn.encrypt_password(password.encode(), role.encode(), b"scram-sha-256").decode()
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role), sql.Literal(verifier)))
        conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(database), sql.Identifier(role)))
    assert url.host is not None and url.port is not None
    return PostgresInstanceDb(hostname=url.host, port=url.port, db_name=database, username=role)


def write_instance_yaml(home: Path, base: Path, storage: Mapping[str, Any] | None) -> Path:
    """``home/dagster.yaml`` from ``base`` (plus the storage block), replaced in one rename so a reader
    never sees half a file."""
    text = compose_instance_yaml(base.read_text(), storage, source=str(base))
    home.mkdir(parents=True, exist_ok=True)
    target = home / "dagster.yaml"
    fd, tmp = tempfile.mkstemp(prefix=".dagster.yaml.", dir=home)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return target


@dataclass(frozen=True)
class InstanceStorage:
    """A prepared instance: its kind, the database (PostgreSQL only) and the variables Dagster needs."""

    kind: StorageKind
    database: PostgresInstanceDb | None = None
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    """Variables every Dagster process needs (the password): give them through the environment only."""

    def sqlalchemy_url(self) -> str:
        """The instance database as a ``postgresql+psycopg://`` URL with the password (for tests to query)."""
        if self.database is None:
            raise DagsterStorageError(f"{STORAGE_ENV}: the instance is on {self.kind}, not PostgreSQL")
        db = self.database
        return URL.create(
            "postgresql+psycopg", username=db.username, password=self.env[PASSWORD_ENV], host=db.hostname,
            port=db.port, database=db.db_name,
        ).render_as_string(hide_password=False)  # fmt: skip


@contextlib.contextmanager
def instance_storage(
    kind: StorageKind, home: Path, base: Path, *, password: str | None = None, durable: bool = True
) -> Iterator[InstanceStorage]:
    """Write ``home/dagster.yaml`` for ``kind``; for PostgreSQL, run a temporary server for the duration.

    ``password`` defaults to a fresh random one. ``durable=False`` turns fsync off (tests only)."""
    if kind == "sqlite":
        home.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(base, home / "dagster.yaml")
        yield InstanceStorage(kind="sqlite")
        return
    password = password if password is not None else secrets.token_urlsafe(24)
    compose_instance_yaml(base.read_text(), {}, source=str(base))  # a base we cannot extend fails before initdb
    with temporary_postgres(durable=durable) as admin_url:
        database = provision_database(admin_url, password)
        write_instance_yaml(home, base, database.storage_config())
        yield InstanceStorage(kind="postgres", database=database, env={PASSWORD_ENV: password})


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Keep a temporary PostgreSQL for a Dagster instance and write its dagster.yaml, until "
        f"SIGINT/SIGTERM. The password comes from ${PASSWORD_ENV}."
    )
    parser.add_argument("--home", type=Path, required=True, help="DAGSTER_HOME: dagster.yaml is written there.")
    parser.add_argument("--base", type=Path, required=True, help="The dagster.yaml the storage block is added to.")
    args = parser.parse_args(argv)
    password = os.environ.get(PASSWORD_ENV, "")
    if not password:
        parser.error(f"{PASSWORD_ENV} is not set: the instance database's password comes from the environment only")
    stop = threading.Event()

    def request_stop(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, request_stop)
    try:
        with instance_storage("postgres", args.home, args.base, password=password) as storage:
            db = storage.database
            assert db is not None
            print(
                f"dagster_storage: instance on PostgreSQL {db.hostname}:{db.port}, database {db.db_name}, "
                f"role {db.username} (password from ${PASSWORD_ENV}); {args.home / 'dagster.yaml'} written",
                flush=True,
            )
            while not stop.wait(1.0):
                pass
    except DagsterStorageError as exc:
        print(f"dagster_storage: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
