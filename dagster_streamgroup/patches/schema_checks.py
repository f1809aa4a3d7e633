"""Dagster's SQL schedule storage with its schema checks answered once per storage instead of at every call.

Each call of Dagster's schedule storage that reads or writes a sensor's state or ticks first asks whether the
tables and secondary indexes it needs exist: ``has_instigators_table`` builds a SQLAlchemy inspector and lists
the database's tables, ``has_secondary_index_table`` does the same, and ``has_built_index`` queries the
index-migration table. One sensor tick makes about a dozen such calls in the daemon, and more in the code
server: in a CPU profile (py-spy, GIL held) of the example deployment at rest, the checks were about a third of
the daemon's CPU, most of it the bookkeeping of the member sensors' ticks. Their answers change only one way,
from no to yes, when ``dagster instance migrate`` creates a table or completes an index; nothing in Dagster drops
them under a running process. So a yes is kept for the storage object's life and a no is asked again at every
call (a migration run beside a live daemon is still seen). Dagster's PostgreSQL run storage keeps its
``has_built_index`` answers the same way.

Member sensors install it in the code server, and ``MemberRunCoordinator`` in the processes that build the
instance's run coordinator (the daemon, which ticks the sensors, and the webserver). Dagster's module is
imported only once the guard (``dagster_streamgroup.patches.enabled``) allows it.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

from dagster_streamgroup import patches

STORAGE_MODULE = "dagster._core.storage.schedules.sql_schedule_storage"
CHECKS = ("has_instigators_table", "_has_instigators_table", "has_secondary_index_table", "has_built_index")
"""The methods of ``SqlScheduleStorage`` that answer "does this table or index exist yet"."""

KEPT = "_streamgroup_schema_checks"
"""The attribute of a storage object that holds the checks it answered yes to."""


def _keep_yes(check: Callable[..., bool], name: str) -> Callable[..., bool]:
    """``check`` answered from the storage's kept answers once it said yes. The key is the check's name and,
    for ``has_built_index``, the index's; a connection argument (``_has_instigators_table``) is not part of it."""

    @functools.wraps(check)
    def answer(storage: Any, *args: Any) -> bool:
        key = (name, args[0] if name == "has_built_index" and args else "")
        known: set[tuple[str, str]] = storage.__dict__.setdefault(KEPT, set())
        if key in known:
            return True
        result = check(storage, *args)
        if result is True:
            known.add(key)
        return result

    answer.__streamgroup_original__ = check  # type: ignore[attr-defined]
    return answer


def install() -> bool:
    """Keep the yes answers of the schedule storage's schema checks; False on a Dagster the patches were not
    verified on, or where a check is not the method this module knows (none is then replaced)."""
    if not patches.enabled():
        return False
    storage_class: Any = importlib.import_module(STORAGE_MODULE).SqlScheduleStorage
    current = {name: storage_class.__dict__.get(name) for name in CHECKS}
    if any(getattr(method, "__streamgroup_original__", None) is not None for method in current.values()):
        return True
    if not all(callable(method) for method in current.values()):
        return False
    for name, method in current.items():
        setattr(storage_class, name, _keep_yes(method, name))
    return True
