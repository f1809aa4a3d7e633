"""Dagster's schema checks with alembic's migration scripts parsed once per process instead of at every check.

Whenever a Dagster storage is built it compares its database's schema revision with the head of alembic's
migration scripts (``dagster._core.storage.sql.check_alembic_revision``). A run worker builds the run, event log
and schedule storages of its instance (and on SQLite the run's own event database), and so does every sensor
evaluation in the code server that opens ``context.instance``. Each check builds a new
``alembic.script.ScriptDirectory`` and executes every migration script to find the head: CPU profiles put it
at about 45% of a member sensor's tick in the code server and a large share of a run worker's start. The
scripts are files of the installed dagster, which do not change under a running process (a fork server is
replaced when an installed file changes): member sensors install the parsed directory in the code server, and
the fork server parses it before it forks, so every child reads the directory it inherited. The check's result
is the same; only the parsing is shared.

Dagster's module is imported only once the guard (``dagster_streamgroup.patches.enabled``) allows it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from dagster_streamgroup import patches

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory


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


def install() -> bool:
    """Make Dagster's schema check use scripts parsed once (on first use); False on a Dagster the patches were
    not verified on, or where its check is not the one this module knows (it is then left alone)."""
    if not patches.enabled():
        return False
    from alembic.script import ScriptDirectory
    from dagster._core.storage import sql

    module: Any = sql
    if getattr(module, "ScriptDirectory", None) not in (ScriptDirectory, ParsedScripts):
        return False
    module.ScriptDirectory = ParsedScripts
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
