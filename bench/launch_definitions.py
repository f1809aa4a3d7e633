"""The code location of ``bench.launch``: one trivial asset, in a module that imports what the example's code
location imports (the plugin's Dagster surface), and whose run imports what a stream run imports before it
reads a record (the Spark Connect client, pandas, pyarrow, confluent-kafka). So a run pays the fixed costs of a
stream run, and nothing else: no broker, no Spark server, no record."""

import os

import dagster as dg

import dagster_streamgroup.dagster  # noqa: F401  # what the example's definitions.py imports


@dg.asset
def trivial() -> dg.MaterializeResult:
    import confluent_kafka  # noqa: F401
    import pandas  # noqa: F401
    import pyarrow  # noqa: F401
    import pyspark.sql.connect.session  # noqa: F401

    return dg.MaterializeResult(metadata={"pid": dg.MetadataValue.int(os.getpid())})


defs = dg.Definitions(
    assets=[trivial],
    jobs=[dg.define_asset_job("trivial_job", [trivial])],
    executor=dg.in_process_executor,
)
