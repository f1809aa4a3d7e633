"""Dagster's schema checks, parsed once in the fork server instead of in every run.

Whenever a Dagster storage is built it compares its database's schema revision with the head of alembic's
migration scripts (``dagster._core.storage.sql.check_alembic_revision``): a run worker builds the run, event log
and schedule storages of its instance, and on SQLite the event database of the run, so four checks per run. Each
check builds a new ``alembic.script.ScriptDirectory`` and executes every migration script to find the head,
which a profile of forked runs put at about 45% of a run worker's CPU. The scripts are files of the installed
dagster, which cannot change while a fork server lives (it is replaced when an installed file changes): the
server parses them once before it forks, and every child reads the parsed directory it inherited.
"""

from __future__ import annotations

from typing import Any, ClassVar

from alembic.config import Config
from alembic.script import ScriptDirectory


class ParsedScripts:
    """Stands in for ``ScriptDirectory`` in Dagster's check, the one place it is named: one parsed directory
    per script location (its revision map is computed on first use and kept)."""

    parsed: ClassVar[dict[str, ScriptDirectory]] = {}

    @classmethod
    def from_config(cls, config: Config) -> ScriptDirectory:
        location = str(config.get_main_option("script_location"))
        scripts = cls.parsed.get(location)
        if scripts is None:
            scripts = cls.parsed[location] = ScriptDirectory.from_config(config)
        return scripts


def parse_once() -> str:
    """Make Dagster's schema check use the parsed scripts, and parse them now; returns the head revision."""
    from dagster._core.storage import sql

    module: Any = sql
    module.ScriptDirectory = ParsedScripts
    config = Config()
    config.set_main_option("script_location", sql.ALEMBIC_SCRIPTS_LOCATION)
    head = ParsedScripts.from_config(config).as_revision_number("head")
    return str(head)
