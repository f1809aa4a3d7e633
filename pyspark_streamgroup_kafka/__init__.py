"""``streamgroup-kafka`` for Spark's lookup of Python data sources: a Spark 4 driver imports each top-level
``pyspark_*`` module on its Python path once and registers its ``DefaultSource`` for every session, so a run's
new session does not register the source itself (``dagster_streamgroup/spark/registration.py``)."""

from dagster_streamgroup.spark.kafka_source import KafkaRangeDataSource as DefaultSource

__all__ = ["DefaultSource"]
