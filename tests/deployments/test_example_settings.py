"""The example's settings for a group shared by several deployments: ``CLICKSTREAM_STORE_URL`` (the group
state's ``store_url``, given to the resource as ``dagster.EnvVar``) and ``CLICKSTREAM_DRAIN_TIMEOUT_S``.

The example reads its settings when it is imported, so each case loads it in a process of its own, with the
environment the case names, and reports what the code location would show.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from dagster_streamgroup.dagster.devserver import ROOT

PROBE = """
import json
import dagster as dg
from dagster._core.remote_representation.external_data import RepositorySnap
from dagster._serdes import serialize_value
try:
    import definitions
except Exception as exc:
    print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
    raise SystemExit(0)
resource = definitions.defs.resources["streamgroup"]
snapshot = serialize_value(RepositorySnap.from_def(definitions.defs.get_repository_def()))
print(json.dumps({
    "store_url": resource.store_url,
    "drain_timeout_s": resource.drain_timeout_s,
    "snapshot_has_password": "pw-in-url" in snapshot,
    "snapshot_names_variable": "CLICKSTREAM_STORE_URL" in snapshot,
}))
"""


def load_example(env: dict[str, str]) -> dict[str, Any]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("CLICKSTREAM_")}
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.slow
def test_store_url_reaches_the_resource_as_an_env_var_and_never_as_a_literal() -> None:
    shown = load_example(
        {
            "CLICKSTREAM_STORE_URL": "postgresql://streamgroup:pw-in-url@10.0.0.5/groups",
            "CLICKSTREAM_DRAIN_TIMEOUT_S": "45",
        }
    )
    assert shown["drain_timeout_s"] == 45
    assert not shown["snapshot_has_password"]
    assert shown["snapshot_names_variable"]  # the UI shows where the URL comes from, not what it is


@pytest.mark.slow
def test_without_settings_the_state_stays_next_to_the_instance() -> None:
    shown = load_example({})
    assert shown["store_url"] is None  # SQLite in $DAGSTER_HOME, the resource's default
    assert shown["drain_timeout_s"] == 600
    assert not shown["snapshot_names_variable"]


@pytest.mark.slow
def test_a_bad_drain_timeout_names_its_variable() -> None:
    shown = load_example({"CLICKSTREAM_DRAIN_TIMEOUT_S": "soon"})
    assert shown["error"] == "SettingsError: CLICKSTREAM_DRAIN_TIMEOUT_S: must be a number, got 'soon'"
