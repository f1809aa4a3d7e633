"""Where Spark's own Kafka source (``spark-sql-kafka-0-10``) comes from, and how a session we start gets it.

The connector is a JVM package of the same Spark version as the session's. A deployment supplies it the Spark
way (``spark.jars.packages`` or ``spark.jars``); this project's set-up fetches the one for its pinned Spark from
Maven Central into ``.tools/spark-kafka-<version>/jars`` (``spark_kafka/pom.xml``, checked against
``spark_kafka/jars.sha256``), with its own ``kafka-clients`` kept apart from the local broker's jars. The local
sessions and Spark Connect servers the project starts put those jars on their classpath when they are there.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

JARS_ENV = "STREAMGROUP_SPARK_KAFKA_JARS"
"""A folder of the connector's jars, for a machine where they live elsewhere than the project's ``.tools``."""

CONNECTOR_JAR_PREFIX = "spark-sql-kafka-0-10_2.13-"
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def spark_version() -> str:
    import pyspark

    return str(pyspark.__version__)


def spark_kafka_jars(version: str | None = None) -> list[Path]:
    """The jars of Spark's Kafka source for ``version`` (the installed PySpark's by default): from
    ``STREAMGROUP_SPARK_KAFKA_JARS``, else the project's fetched copy; empty when there are none, since a
    deployment may supply the connector through ``spark.jars.packages`` instead."""
    version = version or spark_version()
    override = os.environ.get(JARS_ENV, "").strip()
    folders = [Path(override)] if override else []
    folders += [root / ".tools" / f"spark-kafka-{version}" / "jars" for root in (PROJECT_ROOT, Path.cwd())]
    for folder in folders:
        if (folder / f"{CONNECTOR_JAR_PREFIX}{version}.jar").is_file():
            return sorted(folder.glob("*.jar"))
    return []


def with_spark_kafka_jars(conf: Mapping[str, str]) -> dict[str, str]:
    """``conf`` with the connector's jars added to ``spark.jars`` (after the caller's own), when they are there
    and the caller names no connector of their own in ``spark.jars`` or ``spark.jars.packages``."""
    out = dict(conf)
    own = ",".join(conf.get(key, "") for key in ("spark.jars", "spark.jars.packages"))
    if "spark-sql-kafka" in own:
        return out
    jars = [str(path) for path in spark_kafka_jars()]
    if jars:
        out["spark.jars"] = ",".join(filter(None, [conf.get("spark.jars", "").strip(), *jars]))
    return out


FORMATS_JAR_PREFIX = "spark-avro_2.13-"
FORMATS_JARS_ENV = "STREAMGROUP_SPARK_FORMATS_JARS"
"""A folder of Spark's Avro functions (spark-avro) for a machine where they live elsewhere than ``.tools``."""


def spark_format_jars(version: str | None = None) -> list[Path]:
    """The jars of Spark's Avro functions (``from_avro``, ``to_avro``) for ``version``: from
    ``STREAMGROUP_SPARK_FORMATS_JARS``, else the project's fetched copy (``spark_formats/pom.xml``); empty when
    there are none (a deployment supplies them through ``spark.jars.packages``)."""
    version = version or spark_version()
    override = os.environ.get(FORMATS_JARS_ENV, "").strip()
    folders = [Path(override)] if override else []
    folders += [root / ".tools" / f"spark-formats-{version}" / "jars" for root in (PROJECT_ROOT, Path.cwd())]
    for folder in folders:
        if (folder / f"{FORMATS_JAR_PREFIX}{version}.jar").is_file():
            return sorted(folder.glob("*.jar"))
    return []


def with_spark_format_jars(conf: Mapping[str, str]) -> dict[str, str]:
    """``conf`` with spark-avro added to ``spark.jars`` when it is there and the caller names none of their own."""
    out = dict(conf)
    own = ",".join(conf.get(key, "") for key in ("spark.jars", "spark.jars.packages"))
    if "spark-avro" in own:
        return out
    jars = [str(path) for path in spark_format_jars()]
    if jars:
        out["spark.jars"] = ",".join(filter(None, [conf.get("spark.jars", "").strip(), *jars]))
    return out
