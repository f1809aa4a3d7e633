"""Which extra to install when an optional dependency is missing.

The library itself needs only its runtime dependencies. PostgreSQL (psycopg for the group state,
dagster-postgres for the Dagster instance) comes with ``dagster-streamgroup[postgres]``; what only trying the
project locally needs (the local v3io server's web stack, the local broker's certificates, ``dagster dev``)
comes with ``dagster-streamgroup[local]``. A bare ``No module named 'uvicorn'`` leaves the user to guess which
of those brings it, so the modules that import them raise ``MissingExtraError`` naming the extra instead.
"""

from __future__ import annotations

import importlib.util
from typing import Literal

Extra = Literal["local", "postgres", "formats"]


class MissingExtraError(ImportError):
    """An optional dependency is not installed; the message names the extra that brings it."""


def install_command(extra: Extra) -> str:
    return f"pip install 'dagster-streamgroup[{extra}]'"


def missing_extra(module: str, extra: Extra, needed_by: str) -> MissingExtraError:
    """The error to raise from ``except ImportError`` around an optional import."""
    return MissingExtraError(
        f"{needed_by} needs {module!r}, which is not installed: {install_command(extra)}", name=module
    )


def require(module: str, extra: Extra, needed_by: str) -> None:
    """Raise ``MissingExtraError`` unless the top-level ``module`` can be imported (it is not imported here)."""
    if importlib.util.find_spec(module) is None:
        raise missing_extra(module, extra, needed_by)
