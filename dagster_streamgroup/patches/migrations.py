"""Dagster's schema checks with alembic's migration scripts parsed once per process instead of at every check.

Whenever a Dagster storage is built it compares its database's schema revision with the head of alembic's
migration scripts (``dagster._core.storage.sql.check_alembic_revision``). A run worker builds the run, event log
and schedule storages of its instance (and on SQLite the run's own event database), and so does every sensor
evaluation in the code server that opens ``context.instance``. Each check builds a new
``alembic.script.ScriptDirectory`` and executes every migration script to find the head: CPU profiles put it
at about 45% of a member sensor's tick in the code server and a large share of a run worker's start. The
scripts are files of the installed dagster, which do not change under a running process (a fork server is
replaced when an installed file changes): member sensors install the parsed directory in the code server, the
run coordinator in the daemon, and the fork server parses it before it forks, so every child reads the directory
it inherited. The check's result is the same; only the parsing is shared.

On SQLite every run has an event database of its own, which the daemon creates when it creates the run (its
first event). Dagster stamps a new database with alembic's ``stamp`` command, which parses the scripts again
and executes their ``env.py``: with the check, about 40 ms of the daemon's CPU per run (``docs/benchmarks.md``).
The SQLite storages therefore stamp through alembic's ``MigrationContext.stamp`` with the parsed directory: the
same version row in the same transaction, and, as Dagster's ``env.py`` does, a concurrent creator's version
table taken as done.

Dagster's module is imported only once the guard (``dagster_streamgroup.patches.enabled``) allows it.
"""

from __future__ import annotations

import importlib
import sqlite3
from typing import TYPE_CHECKING, Any, ClassVar

from dagster_streamgroup import patches
from dagster_streamgroup.patches import sqlite_engines

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory
    from sqlalchemy.engine import Connection

SQLITE_STORAGE_MODULES = sqlite_engines.STORAGE_MODULES
"""Dagster's SQLite storage modules: each stamps a new database (``stamp_alembic_rev`` imported by name)."""


class ParsedScripts:
    """Stands in for ``ScriptDirectory`` in Dagster's check, the one place it is named: one parsed directory
    per script location (its revision map is computed on first use and kept)."""

    parsed: ClassVar[dict[str, ScriptDirectory]] = {}

    @classmethod
    def from_config(cls, config: Config) -> ScriptDirectory:
        from alembic.script import ScriptDirectory

        location = str(config.get_main_option("script_location"))
        scripts = cls.parsed.get(location)
        if scripts is None:
            scripts = cls.parsed[location] = ScriptDirectory.from_config(config)
        return scripts


def stamp_with_parsed_scripts(alembic_config: Config, conn: Connection, rev: str = "head") -> None:
    """Dagster's ``stamp_alembic_rev`` for a new SQLite database, without alembic's command and ``env.py``."""
    from alembic.runtime.migration import MigrationContext
    from dagster._core.storage import sql
    from sqlalchemy import exc

    with sql._alembic_lock:
        try:
            MigrationContext.configure(conn).stamp(ParsedScripts.from_config(alembic_config), rev)
        except (exc.DatabaseError, sqlite3.DatabaseError) as error:
            # Another process created the version table first (as Dagster's env.py, taken as done).
            if "table alembic_version already exists" not in str(error):
                raise


def install() -> bool:
    """Make Dagster's schema check, and the stamp of a new SQLite database, use scripts parsed once (on first
    use); False on a Dagster the patches were not verified on, or where its check is not the one this module
    knows (it is then left alone). A storage module whose stamp is not Dagster's own is left alone too."""
    if not patches.enabled():
        return False
    from alembic.script import ScriptDirectory
    from dagster._core.storage import sql

    module: Any = sql
    if getattr(module, "ScriptDirectory", None) not in (ScriptDirectory, ParsedScripts):
        return False
    module.ScriptDirectory = ParsedScripts
    for name in SQLITE_STORAGE_MODULES:
        storage: Any = importlib.import_module(name)
        if getattr(storage, "stamp_alembic_rev", None) is sql.stamp_alembic_rev:
            storage.stamp_alembic_rev = stamp_with_parsed_scripts
    return True


def parse_once() -> str | None:
    """``install``, and parse the scripts now (a fork server, before it forks); returns the head revision."""
    if not install():
        return None
    from alembic.config import Config
    from dagster._core.storage import sql

    config = Config()
    config.set_main_option("script_location", sql.ALEMBIC_SCRIPTS_LOCATION)
    head = ParsedScripts.from_config(config).as_revision_number("head")
    return str(head)
