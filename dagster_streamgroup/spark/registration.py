"""Making this package's data sources known to a Spark session, at the lowest cost the session allows.

Spark 4 finds Python data sources by itself: once per driver JVM it imports every top-level module named
``pyspark_*`` on the driver's Python path and registers the ``DefaultSource`` each one defines, for every
session of that JVM (``DataSourceManager``'s static sources). This package ships two such modules
(``pyspark_streamgroup_kafka``, ``pyspark_streamgroup_v3io``), so a Spark Connect server or a classic driver with
the package installed knows ``streamgroup-kafka`` and ``streamgroup-v3io`` in each new session. Registering the
source in a session instead (``spark.dataSource.register``) costs the server about 1.7 s of CPU per session,
measured on a local Connect server over small runs, and a member run is a new session: it was the largest fixed
Spark cost of a run.

A driver whose Python lacks the package (another interpreter than the workers', an older release of this
package on a Connect server) still works: one analysis of an empty read tells whether the session knows the
format, and only a session that does not gets the source registered.
"""

from __future__ import annotations

import weakref

from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource

NOT_FOUND = "DATA_SOURCE_NOT_FOUND"
"""The error condition of a format no session or static registration knows."""

_known: dict[str, weakref.WeakSet[SparkSession]] = {}
"""The sessions where each format was checked (or registered) already: one check per session and format."""


def ensure_registered(spark: SparkSession, source: type[DataSource]) -> None:
    """Make ``source`` readable as ``spark.read.format(source.name())`` in ``spark``: known already (the static
    registration above, or an earlier call), or registered now."""
    name = source.name()
    sessions = _known.setdefault(name, weakref.WeakSet())
    if spark in sessions:
        return
    if not knows_format(spark, name):
        spark.dataSource.register(source)
    sessions.add(spark)


def knows_format(spark: SparkSession, name: str) -> bool:
    """Whether ``spark`` resolves the format ``name``: the schema of a read without options (the sources'
    schemas are fixed, so nothing is planned or read)."""
    try:
        spark.read.format(name).load().schema  # noqa: B018 (the analysis is the point: Connect is lazy)
    except Exception as exc:
        # Spark raises SparkClassNotFoundException, which reaches Python untranslated: a Py4JJavaError in a
        # classic session, an UnknownException over Connect. Its condition is in the message on both.
        if f"[{NOT_FOUND}]" in str(exc):
            return False
        raise
    return True
