"""A run launcher that starts Dagster runs from a preloaded fork server (see docs/launcher.md).

Select it in dagster.yaml::

    run_launcher:
      module: dagster_streamgroup.launcher
      class: ForkServerRunLauncher
"""

from dagster_streamgroup.launcher.run_launcher import ForkServerRunLauncher
from dagster_streamgroup.launcher.settings import DEFAULT_PRELOAD_MODULES, LauncherSettings, LauncherSettingsError
from dagster_streamgroup.launcher.worker import WORKER_TAG, RunWorker

__all__ = [
    "DEFAULT_PRELOAD_MODULES",
    "WORKER_TAG",
    "ForkServerRunLauncher",
    "LauncherSettings",
    "LauncherSettingsError",
    "RunWorker",
]
