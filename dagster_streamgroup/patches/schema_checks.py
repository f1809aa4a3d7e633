"""Dagster's SQL storages with their schema checks answered once per storage instead of at every call.

Many calls of Dagster's SQL storages first ask whether a table, a column or a secondary index they need exists.
The schedule storage does it before each read or write of a sensor's state or ticks (``has_instigators_table``
and ``has_secondary_index_table`` build a SQLAlchemy inspector and list the tables, ``has_built_index`` queries
the index-migration table): about a dozen calls a sensor tick in the daemon, and in a CPU profile (py-spy, GIL
held) of the example deployment at rest about a third of the daemon's CPU. The run storage inspects the runs
table's columns at every ``get_run_records`` (``has_run_stats_index_cols``), which a member tick calls up to
three times and the run queue's pass every second; the SQLite event log opens a new engine and connection to
ask whether a table exists (``has_table``) and inspects the asset keys' columns (``has_asset_key_col``) as it
stores an asset's materialization.

Those answers change only one way, from no to yes, when ``dagster instance migrate`` creates a table, adds a
column or completes an index; nothing in Dagster drops them under a running process (a storage's ``wipe()``
deletes rows, and the SQLite event log's per-run files, which come back with the whole schema). So a yes is kept
for the storage object's life and a no is asked again at every call (a migration run beside a live daemon is
still seen). Dagster's PostgreSQL run storage and its consolidated SQLite event log already keep their
``has_built_index`` and ``has_secondary_index`` answers the same way. The event log's ``has_secondary_index``
is left alone: its wipe deletes the index-migration rows.

Member sensors install it in the code server (and the fork server that imports the definitions, whose runs
store the events), and ``MemberRunCoordinator`` in the processes that build the instance's run coordinator (the
daemon, which ticks the sensors and creates the runs, and the webserver). Dagster's modules are imported only
once the guard (``dagster_streamgroup.patches.enabled``) allows it.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dagster_streamgroup import patches


@dataclass(frozen=True)
class Checks:
    """The schema checks one storage class defines (each a method that answers "does this exist yet")."""

    module: str
    class_name: str
    methods: tuple[str, ...]

    def storage_class(self) -> Any:
        return getattr(importlib.import_module(self.module), self.class_name)


SCHEDULE_STORAGE = Checks(
    "dagster._core.storage.schedules.sql_schedule_storage",
    "SqlScheduleStorage",
    ("has_instigators_table", "_has_instigators_table", "has_secondary_index_table", "has_built_index"),
)
RUN_STORAGE = Checks(
    "dagster._core.storage.runs.sql_run_storage",
    "SqlRunStorage",
    (
        "has_built_index",
        "has_run_stats_index_cols",
        "has_bulk_actions_selector_cols",
        "has_backfill_id_column",
        "has_bulk_action_job_name_column",
        "has_backfill_tags_table",
    ),
)
EVENT_LOG_STORAGE = Checks(
    "dagster._core.storage.event_log.sql_event_log",
    "SqlEventLogStorage",
    ("has_asset_key_col", "_has_asset_key_col_on_connection"),
)
SQLITE_EVENT_LOG = Checks(
    "dagster._core.storage.event_log.sqlite.sqlite_event_log", "SqliteEventLogStorage", ("has_table",)
)
CONSOLIDATED_SQLITE_EVENT_LOG = Checks(
    "dagster._core.storage.event_log.sqlite.consolidated_sqlite_event_log",
    "ConsolidatedSqliteEventLogStorage",
    ("has_table",),
)
TARGETS = (SCHEDULE_STORAGE, RUN_STORAGE, EVENT_LOG_STORAGE, SQLITE_EVENT_LOG, CONSOLIDATED_SQLITE_EVENT_LOG)
"""Every storage class whose checks are kept, each with the methods it defines itself (a subclass that
overrides a check is a target of its own)."""
STORAGE_MODULES = tuple(target.module for target in TARGETS)

KEPT = "_streamgroup_schema_checks"
"""The attribute of a storage object that holds the checks it answered yes to."""


def _keep_yes(check: Callable[..., bool], name: str) -> Callable[..., bool]:
    """``check`` answered from the storage's kept answers once it said yes. The key is the check's name and the
    table, column or index it names (its string argument); a connection argument is not part of it."""

    @functools.wraps(check)
    def answer(storage: Any, *args: Any) -> bool:
        key = (name, next((arg for arg in args if isinstance(arg, str)), ""))
        known: set[tuple[str, str]] = storage.__dict__.setdefault(KEPT, set())
        if key in known:
            return True
        result = check(storage, *args)
        if result is True:
            known.add(key)
        return result

    setattr(answer, patches.ORIGINAL, check)
    return answer


def install() -> bool:
    """Keep the yes answers of the storages' schema checks; False on a Dagster the patches were not verified on,
    or where a check is not the method this module knows (none is then replaced)."""
    if not patches.enabled():
        return False
    classes = [(target, target.storage_class()) for target in TARGETS]
    return patches.wrap_methods([(cls, name) for target, cls in classes for name in target.methods], _keep_yes)
