"""The ``dagster dev`` harness lives in the package so ``bench.e2e`` uses the same one.

Its instance storage follows ``DAGSTER_STORAGE`` (``sqlite``, the default, or ``postgres``: a temporary
PostgreSQL server for the instance), so the end-to-end test runs on PostgreSQL with
``DAGSTER_STORAGE=postgres STREAMGROUP_E2E=1 .venv/bin/pytest -m e2e tests/e2e``."""

from dagster_streamgroup.dagster.devserver import ROOT, DagsterDev, Layout, wait_for

__all__ = ["ROOT", "DagsterDev", "Layout", "wait_for"]
