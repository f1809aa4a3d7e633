"""The Kafka integration tests share the session-wide local Spark session of the Spark tests."""

from tests.integration.spark.conftest import spark  # noqa: F401
