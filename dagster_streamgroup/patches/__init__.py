"""Speed-ups that reach into Dagster's internals, in one place behind one guard: the Dagster releases they were
verified on.

The rest of the package uses Dagster as a library; these modules replace or call private parts of it, measured
worth it on a 2-core machine (docs/benchmarks.md, docs/launcher.md):

- ``migrations``: alembic's migration scripts parsed once per process for Dagster's schema checks;
- ``sqlite_engines``: one SQLAlchemy engine per SQLite database file for Dagster's SQLite storages, keeping its
  connections open between uses;
- ``resource_schema``: the config schema of this package's resources inferred once per class;
- ``schema_checks``: the SQL storages' "does this table, column or index exist" answered once it is yes;
- ``run_databases``: each run's SQLite event database copied from an empty one of the same schema;
- ``run_coordinator``: member runs launched at submit by ``MemberRunCoordinator`` (the queue's private test of
  the instance's limits).

Private parts change between Dagster releases without notice, and a patch that misses a change could make
Dagster misbehave silently rather than fail. So each patch asks ``enabled()`` before it touches anything
private: on a release in ``VERIFIED_DAGSTER_VERSIONS`` (each one run through the whole test suite) it goes
ahead; on any other release every patch stays off, Dagster keeps its own behaviour, and one warning per
process names the release. Nothing here imports a private Dagster module at import time, so the package and
the example's ``dagster.yaml`` load on any Dagster the dependency range allows.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Any

VERIFIED_DAGSTER_VERSIONS: frozenset[str] = frozenset({"1.13.27"})
"""The Dagster releases the patches were verified on: the whole suite ran with each (``uv.lock`` pins one;
``tests/patches/test_guard.py`` fails when the lock moves to a release not listed). Add a release here only
after the suite passed on it."""

PATCHES = (
    "the migration-script cache",
    "the shared SQLite engines",
    "the resource-schema cache",
    "the storages' schema-check cache",
    "the run databases copied from an empty one",
    "member runs launched at submit",
)
"""What switching off costs, named in the warning."""

logger = logging.getLogger(__name__)

_warned: set[str] = set()
"""Releases already warned about in this process: one warning, however many patches ask."""


@functools.cache
def _installed_dagster() -> str:
    return metadata.version("dagster")


def dagster_version() -> str:
    """The installed Dagster release (from its distribution's metadata: reading it imports nothing)."""
    return _installed_dagster()


def enabled() -> bool:
    """Whether the patches may touch Dagster's internals: the installed release is one they were verified on.
    Otherwise warns once per process, naming the release, and every patch leaves Dagster alone."""
    version = dagster_version()
    if version in VERIFIED_DAGSTER_VERSIONS:
        return True
    if version not in _warned:
        _warned.add(version)
        logger.warning(
            "dagster-streamgroup: Dagster %s is not one of the releases its speed-ups were verified on (%s); "
            "%s stay off and Dagster's own behaviour is kept",
            version,
            ", ".join(sorted(VERIFIED_DAGSTER_VERSIONS)),
            ", ".join(PATCHES),
        )
    return False


ORIGINAL = "__streamgroup_original__"
"""The attribute of a replacing method that holds the method it replaced (what the tests and a second install
look for)."""


def wrap_methods(
    methods: Sequence[tuple[type[Any], str]], wrap: Callable[[Callable[..., Any], str], Callable[..., Any]]
) -> bool:
    """Replace each class's own method ``name`` with ``wrap(method, name)``, which sets ``ORIGINAL``; once per
    process (a method already replaced stays). False, and nothing replaced, when one of them is not a method the
    class defines itself: Dagster changed, and a patch must not half apply."""
    current: dict[tuple[type[Any], str], Any] = {(cls, name): cls.__dict__.get(name) for cls, name in methods}
    if not all(callable(method) for method in current.values()):
        return False
    for (cls, name), method in current.items():
        if getattr(method, ORIGINAL, None) is None:
            setattr(cls, name, wrap(method, name))
    return True
