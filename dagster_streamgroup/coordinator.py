"""The run coordinator's configuration path: ``dagster.yaml`` names ``module: dagster_streamgroup.coordinator``,
``class: MemberRunCoordinator``.

The class lives with the package's other uses of Dagster's internals, behind their version guard, in
``dagster_streamgroup/patches/run_coordinator.py``; this module keeps the path instances are configured with.
"""

from dagster_streamgroup.patches.run_coordinator import MemberRunCoordinator

__all__ = ["MemberRunCoordinator"]
