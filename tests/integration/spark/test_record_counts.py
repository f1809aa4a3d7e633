"""Records per shard counted by the function's own action (``DataFrame.observe``), in a real local session."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

from dagster_streamgroup.spark.record_counts import ObservedRecords

pytestmark = [pytest.mark.spark]


def rows(spark: SparkSession) -> DataFrame:
    data = [("a", i) for i in range(7)] + [("b", i) for i in range(3)]
    return spark.createDataFrame(data, "shard string, offset long")


def conditions() -> dict:  # type: ignore[type-arg]
    return {"a": F.col("shard") == "a", "b": F.col("shard") == "b", "c": F.col("shard") == "c"}


def test_the_functions_action_counts_each_shard_without_a_pass_of_its_own(spark: SparkSession, tmp_path: Path) -> None:
    passes: list[str] = []

    def separately(df: DataFrame) -> dict[str, int]:
        passes.append("count")
        return {}

    observed = ObservedRecords(rows(spark), conditions(), separately)
    observed.df.groupBy("shard").agg(F.max("offset")).write.parquet(str(tmp_path / "out"))
    assert observed.counts() == {"a": 7, "b": 3, "c": 0}
    assert passes == [], "the counts came with the function's write"


def test_a_function_that_runs_no_action_gets_the_counts_from_a_pass_of_their_own(spark: SparkSession) -> None:
    def separately(df: DataFrame) -> dict[str, int]:
        return {str(r["shard"]): int(r["count"]) for r in df.groupBy("shard").count().collect()}

    observed = ObservedRecords(rows(spark), conditions(), separately)
    observed.df.select("offset")  # lazy: nothing runs
    assert observed.counts() == {"a": 7, "b": 3}
