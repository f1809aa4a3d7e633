"""The smallest code location for the instance-storage test: one asset and a job that materializes it."""

import dagster as dg


@dg.asset
def greeting() -> dg.MaterializeResult[None]:
    """Materialized by every run of ``greeting_job``: one event a test can find in the instance's tables."""
    return dg.MaterializeResult(metadata={"words": 2})


greeting_job = dg.define_asset_job("greeting_job", selection=[greeting])

defs = dg.Definitions(assets=[greeting], jobs=[greeting_job])
