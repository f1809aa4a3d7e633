"""One local Spark session for the whole test session (starting one costs several seconds)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from dagster_streamgroup.spark.session import local_spark_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = local_spark_session(app_name="streamgroup-tests", conf={"spark.driver.memory": "1g"})
    try:
        yield session
    finally:
        session.stop()
