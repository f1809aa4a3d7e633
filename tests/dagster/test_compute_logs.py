"""Compute logs mirrored by a thread: the same captured files as Dagster's local manager, the step's output
still mirrored to the process's own stdout and stderr, and no ``tail`` or watcher process per step. Each job
runs in a Python process of its own, whose output this test reads."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from dagster._core.errors import DagsterInvariantViolationError
from dagster._core.instance.ref import InstanceRef

from dagster_streamgroup.compute_logs import IDLE_POLL_S, Mirror, ThreadMirroredComputeLogManager

PROBE = Path(__file__).parent / "compute_log_probe" / "probe.py"
OURS = "dagster_streamgroup.compute_logs.ThreadMirroredComputeLogManager"
DAGSTERS = "dagster._core.storage.local_compute_log_manager.LocalComputeLogManager"


def run_probe(manager: str, base_dir: Path) -> tuple[dict[str, Any], str, str]:
    done = subprocess.run(
        [sys.executable, str(PROBE), manager, str(base_dir)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stdout, done.stderr


@pytest.mark.parametrize("manager", [OURS, DAGSTERS], ids=["thread-mirrored", "dagster-local"])
def test_a_steps_output_is_captured_as_the_ui_reads_it(manager: str, tmp_path: Path) -> None:
    facts, _, _ = run_probe(manager, tmp_path / "logs")
    assert facts["manager"] == manager.rpartition(".")[2]
    assert facts["stdout"] == "to stdout from the step\n"
    assert "to stderr from the step\n" in facts["stderr"]
    assert facts["complete"]


def test_the_thread_mirror_copies_every_line_and_starts_no_process_where_dagsters_starts_four(
    tmp_path: Path,
) -> None:
    """Dagster's ``tail -F`` polls once a second and is stopped when the step ends, so a short step's lines
    can miss the process's output (its ``DAGSTER_COMPUTE_LOG_TAIL_WAIT_AFTER_FINISH`` is the workaround); the
    thread reads each file one last time after the step."""
    ours, stdout, stderr = run_probe(OURS, tmp_path / "ours")
    assert "to stdout from the step" in stdout and "to stderr from the step" in stderr, "mirrored to the process"
    dagsters, _, _ = run_probe(DAGSTERS, tmp_path / "dagsters")
    assert (ours["children"], dagsters["children"]) == (0, 4), "tail -F and its watcher for stdout and for stderr"


def test_base_dir_defaults_to_dagsters_own_place_under_dagster_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    manager = ThreadMirroredComputeLogManager.from_config_value(None, {})
    assert manager._base_dir == str(tmp_path / "storage")
    assert ThreadMirroredComputeLogManager.from_config_value(None, {"base_dir": "/x"})._base_dir == "/x"
    monkeypatch.delenv("DAGSTER_HOME")
    unbound = ThreadMirroredComputeLogManager.from_config_value(None, {})
    with pytest.raises(DagsterInvariantViolationError, match="base_dir: not set, DAGSTER_HOME is not set"):
        unbound.capture_logs(["a", "b"]).__enter__()


def test_without_dagster_home_the_logs_go_to_the_temporary_instances_storage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What ``dg dev`` and ``dagster dev`` do without ``DAGSTER_HOME``: a temporary instance folder, with the
    ``dagster.yaml`` of the working directory (a dg project's root) as its settings. The block the scaffold writes
    there loads, and the logs go where Dagster's own default would put them."""
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    config_dir, temporary = tmp_path / "project", tmp_path / "project" / ".tmp_dagster_home_x"
    temporary.mkdir(parents=True)
    (config_dir / "dagster.yaml").write_text(
        "compute_logs:\n  module: dagster_streamgroup.compute_logs\n  class: ThreadMirroredComputeLogManager\n"
    )
    with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(temporary), config_dir=str(config_dir))) as instance:
        manager = instance.compute_log_manager
        assert isinstance(manager, ThreadMirroredComputeLogManager)
        assert manager._base_dir == str(temporary / "storage")
        with manager.capture_logs(["run", "step"]):
            pass
        assert manager.is_capture_complete(["run", "step"])


def _wakeups(thread_id: int) -> int:
    status = Path(f"/proc/self/task/{thread_id}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("voluntary_ctxt_switches")))


def test_the_mirror_looks_less_often_while_a_step_is_quiet_and_closely_again_once_it_prints(tmp_path: Path) -> None:
    """A run mostly waits on Spark: its mirror thread should not wake ten times a second for nothing. Its wakeups
    are the kernel's count of the thread's voluntary context switches."""
    source = tmp_path / "step.out"
    source.write_bytes(b"")
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    with Mirror() as mirror:
        mirror.follow(str(source), write_end)
        thread_id = mirror._thread.native_id
        assert thread_id is not None
        time.sleep(2.0)  # the wait grows to IDLE_POLL_S
        before = _wakeups(thread_id)
        time.sleep(4.0)
        quiet = _wakeups(thread_id) - before
        assert quiet <= 8, f"{quiet} wakeups in 4 quiet seconds (looking every 0.1 s: about 40)"
        with source.open("ab") as out:
            out.write(b"a line\n")
        deadline = time.monotonic() + IDLE_POLL_S + 2.0
        seen = b""
        while b"a line\n" not in seen and time.monotonic() < deadline:
            time.sleep(0.05)
            with contextlib.suppress(BlockingIOError):
                seen += os.read(read_end, 100)
        assert seen == b"a line\n", "mirrored within one idle wait"
    os.close(read_end)
