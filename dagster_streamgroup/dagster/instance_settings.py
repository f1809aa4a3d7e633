"""The Dagster instance settings that make stream runs cheap, as one ``dagster.yaml`` a ``dg`` project gets.

The example's ``dagster.yaml`` is what makes its runs start in under a second: the fork-server run launcher,
``MemberRunCoordinator``, the thread-mirrored compute logs, sensors evaluated in threads, run monitoring. A
project made by ``create-dagster`` has none of it, and Dagster's defaults start every run as a new interpreter
(seconds of CPU before it reads a record). ``dg dev`` and ``dagster dev`` without ``DAGSTER_HOME`` keep a
temporary instance whose settings come from the ``dagster.yaml`` of the working directory, the project's root
under ``dg dev``; with ``DAGSTER_HOME`` set, from ``$DAGSTER_HOME/dagster.yaml``. So the component's scaffold
writes the settings to the project's root when no file is there, and otherwise names the settings the file in
force lacks, with what each buys, without touching it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

INSTANCE_FILE = "dagster.yaml"

INSTANCE_YAML = """\
# Dagster instance settings for stream runs (dagster-streamgroup; docs/dagster.md, "The run economy").
# `dg dev` and `dagster dev` read this file from the project's root while DAGSTER_HOME is unset; with
# DAGSTER_HOME set, copy it to $DAGSTER_HOME/dagster.yaml. Delete a block to get Dagster's default back.
#
# Member runs launch when their sensor submits them (the queue would launch them now) instead of at the queue's
# next pass; at most one in-progress run per shard (single-shard runs and backfills carry the tag).
run_coordinator:
  module: dagster_streamgroup.coordinator
  class: MemberRunCoordinator
  config:
    max_concurrent_runs: 8
    dequeue_interval_seconds: 1
    dequeue_use_threads: true
    dequeue_num_workers: 8
    tag_concurrency_limits:
      - key: "streamgroup/shard"
        value:
          applyLimitPerUniqueValue: true
        limit: 1
# A run is a fork of a server that has Dagster, the definitions and Spark's client imported: it starts in under
# a second instead of a new interpreter's seconds of CPU; a worker whose run succeeded runs the next ones.
run_launcher:
  module: dagster_streamgroup.launcher
  class: ForkServerRunLauncher
  config:
    runs_per_worker: 20
    worker_idle_seconds: 300
# Dagster's local compute logs (the UI's stdout/stderr), mirrored by a thread instead of tail processes per step.
compute_logs:
  module: dagster_streamgroup.compute_logs
  class: ThreadMirroredComputeLogManager
# A run whose worker died is failed, so its ranges are retried; one that runs too long is stopped.
run_monitoring:
  enabled: true
  poll_interval_seconds: 5
  start_timeout_seconds: 180
  max_runtime_seconds: 3600
# Member sensors evaluated side by side: a member draining a backlog waits in its tick for its run to end and
# launches the next at once (tick_wait_s), without holding up the other members.
sensors:
  use_threads: true
  num_workers: 4
"""


@dataclass(frozen=True)
class Setting:
    """One setting the run economy needs: where it is in ``dagster.yaml``, the value, and what it buys."""

    path: tuple[str, ...]
    value: Any
    buys: str

    @property
    def name(self) -> str:
        return ".".join(self.path)

    def holds(self, config: Mapping[str, Any]) -> bool:
        node: Any = config
        for key in self.path:
            if not isinstance(node, Mapping) or key not in node:
                return False
            node = node[key]
        return bool(node == self.value)


SETTINGS = (
    Setting(
        ("run_launcher", "class"),
        "ForkServerRunLauncher",
        "a run starts in under a second as a fork of a preloaded server, instead of a new interpreter's seconds",
    ),
    Setting(
        ("run_coordinator", "class"),
        "MemberRunCoordinator",
        "a member run launches when its sensor submits it, with at most one run per shard",
    ),
    Setting(
        ("compute_logs", "class"),
        "ThreadMirroredComputeLogManager",
        "a step's output is mirrored by a thread, not by tail processes",
    ),
    Setting(("sensors", "use_threads"), True, "member sensors tick side by side, and a draining member chains runs"),
    Setting(("run_monitoring", "enabled"), True, "a run whose worker died is failed and its ranges retried"),
)


def missing(config: Mapping[str, Any]) -> list[Setting]:
    return [setting for setting in SETTINGS if not setting.holds(config)]


def instance_file(project_root: Path) -> tuple[Path, bool]:
    """The ``dagster.yaml`` ``dg dev`` reads for this project, and whether it is the project's own (``DAGSTER_HOME``
    unset) rather than the deployment's."""
    home = os.environ.get("DAGSTER_HOME")
    if home:
        return Path(home) / INSTANCE_FILE, False
    return project_root / INSTANCE_FILE, True


def ensure_instance_settings(project_root: Path) -> str:
    """Write the settings to the project's ``dagster.yaml`` when ``dg dev`` would read none; otherwise say which
    of them the file in force lacks. Returns what it did or found, for the user."""
    import yaml  # type: ignore[import-untyped]  # a dependency of dagster; no types-PyYAML in the lock

    path, own = instance_file(project_root)
    if not path.exists():
        if not own:
            return (
                f"DAGSTER_HOME is set and {path} does not exist: Dagster starts every run as a new interpreter. "
                f"For runs that start in under a second, put the settings of {project_root / INSTANCE_FILE} there "
                "(docs/dagster.md, The run economy)."
            ) + _write(project_root / INSTANCE_FILE)
        return _write(path).strip()
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        return f"{path}: not read ({exc}); left as it is."
    lacking = missing(config if isinstance(config, Mapping) else {})
    if not lacking:
        return f"{path} has the stream runs' instance settings."
    lines = "\n".join(f"  - {s.name}: {s.value!r}: {s.buys}" for s in lacking)
    return (
        f"{path} is left as it is; it lacks the settings that make stream runs cheap:\n{lines}\n"
        "The whole block: docs/dagster.md, The run economy (or scaffold again in a project without a dagster.yaml)."
    )


def _write(path: Path) -> str:
    if path.exists():
        return ""
    path.write_text(INSTANCE_YAML, encoding="utf-8")
    return (
        f"\nWrote {path}: the instance settings `dg dev` reads while DAGSTER_HOME is unset "
        "(the fork-server run launcher, MemberRunCoordinator, thread-mirrored compute logs, run monitoring, "
        "sensors in threads)."
    )


__all__ = ["INSTANCE_YAML", "SETTINGS", "Setting", "ensure_instance_settings", "missing"]
