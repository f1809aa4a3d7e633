"""The ``dagster dev`` harness lives in the package so ``bench.e2e`` uses the same one."""

from dagster_streamgroup.dagster.devserver import ROOT, DagsterDev, wait_for

__all__ = ["ROOT", "DagsterDev", "wait_for"]
