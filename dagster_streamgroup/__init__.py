"""dagster-streamgroup.

This package is the ``dagster_dg_cli.registry_modules`` entry point, so ``dg`` names its components
``dagster_streamgroup.KafkaStreamGroupComponent`` and ``dagster_streamgroup.V3ioStreamGroupComponent``. They are
imported on first access, not here: Spark's Python workers, the protocol and the stores import this package
too, and should not pay for importing Dagster.
"""

import warnings
from typing import TYPE_CHECKING, Any

# dagster-pyspark (the Spark resource's base) brings dagster-spark, whose preview Spark pipeline component `dg`
# lists in every project that installs this package; `dg check`, `dg scaffold` and `dg dev` then print Dagster's
# warning about that preview scaffolder, which the user neither chose nor uses. This one warning is hidden; any
# other preview warning, dagster-spark's included, is left as Dagster shows it.
warnings.filterwarnings("ignore", message=r"Class `SparkDeclarativePipelineScaffolder` is currently in preview")

if TYPE_CHECKING:
    from dagster_streamgroup.dagster.component import KafkaStreamGroupComponent, V3ioStreamGroupComponent

COMPONENTS = ("KafkaStreamGroupComponent", "V3ioStreamGroupComponent")

__all__ = ["KafkaStreamGroupComponent", "V3ioStreamGroupComponent"]


def __getattr__(name: str) -> Any:
    if name in COMPONENTS:
        from dagster_streamgroup.dagster import component

        return getattr(component, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *COMPONENTS})
