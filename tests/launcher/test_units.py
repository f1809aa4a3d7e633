"""The launcher's small parts on their own: settings, the worker tag, fingerprints, process identity, the
channel's messages."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest
from dagster._core.code_pointer import FileCodePointer
from dagster._core.origin import RepositoryPythonOrigin

from dagster_streamgroup.launcher import WORKER_TAG, LauncherSettings, LauncherSettingsError, RunWorker, process
from dagster_streamgroup.launcher.fingerprint import installed_roots, source_files, take
from dagster_streamgroup.launcher.protocol import Channel, ChannelClosedError, Exited, Fork, Forked
from dagster_streamgroup.launcher.workdir import code_directory, unreachable_code_file


def test_settings_defaults_and_errors_that_name_the_field() -> None:
    settings = LauncherSettings.from_config({})
    assert "pyspark.sql.connect.session" in settings.preload_modules and settings.start_timeout_seconds > 0
    with pytest.raises(LauncherSettingsError, match=r"start_timeout_seconds: Input should be greater than 0"):
        LauncherSettings.from_config({"start_timeout_seconds": 0})
    with pytest.raises(LauncherSettingsError, match=r"preload_modules: Value error, 'pandas; rm' is not a dotted"):
        LauncherSettings.from_config({"preload_modules": ["pandas; rm"]})
    with pytest.raises(LauncherSettingsError, match=r"preload_module: Extra inputs are not permitted"):
        LauncherSettings.from_config({"preload_module": ["pandas"]})
    assert settings.runs_per_worker == 1, "a new process per run unless configured"
    with pytest.raises(LauncherSettingsError, match=r"runs_per_worker: Input should be greater than or equal to 1"):
        LauncherSettings.from_config({"runs_per_worker": 0})
    with pytest.raises(LauncherSettingsError, match=r"worker_idle_seconds: Input should be greater than 0"):
        LauncherSettings.from_config({"worker_idle_seconds": 0})


def test_worker_tag_round_trip_and_unreadable_tags() -> None:
    worker = RunWorker(host="h", boot_id="b", pid=12, start_ticks=34, via="fork", server_pid=5)
    assert RunWorker.from_tags(worker.tag()) == worker
    assert "runs_before" not in worker.tag()[WORKER_TAG], "a process started for its run"
    reused = worker.model_copy(update={"runs_before": 2})
    assert RunWorker.from_tags(reused.tag()) == reused
    assert RunWorker.from_tags({}) is None
    assert RunWorker.from_tags({WORKER_TAG: "not json"}) is None


def test_a_worker_is_known_running_only_on_its_own_host_and_boot() -> None:
    started = process.start_ticks(os.getpid())
    assert started is not None
    here = RunWorker(
        host=process.hostname(), boot_id=process.boot_id(), pid=os.getpid(), start_ticks=started, via="spawn"
    )
    assert here.still_running_here()
    assert not here.model_copy(update={"start_ticks": started + 1}).still_running_here(), "another process"
    assert not here.model_copy(update={"host": "elsewhere"}).still_running_here(), "cannot be known"
    assert not here.model_copy(update={"boot_id": "before-a-reboot"}).still_running_here()


def test_process_identity_tells_a_reused_pid_apart() -> None:
    me = os.getpid()
    started = process.start_ticks(me)
    assert started is not None
    assert process.state(me, started) is process.ProcessState.RUNNING
    assert process.state(me, started + 1) is process.ProcessState.EXITED
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    assert process.start_ticks(done.pid) is None
    assert process.state(done.pid, 0) is process.ProcessState.EXITED


def test_a_zombie_counts_as_exited() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    started = process.start_ticks(child.pid)
    assert started is not None
    deadline = time.monotonic() + 30
    while "Z" not in Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]:
        assert time.monotonic() < deadline, "the child did not exit"
        time.sleep(0.01)
    assert process.state(child.pid, started) is process.ProcessState.EXITED  # exited, not waited for yet
    child.wait()


def test_fingerprint_sees_user_files_change_and_ignores_installed_ones(tmp_path: Path) -> None:
    user = tmp_path / "user_module.py"
    user.write_text("X = 1\n")
    module = types.ModuleType("user_module")
    module.__file__ = str(user)
    installed = sys.modules["pydantic"]
    assert source_files([module, installed], installed_roots()) == [os.path.realpath(user)]
    fingerprint = take([module, installed])
    assert fingerprint.changed() == []
    user.write_text("X = 22\n")
    assert fingerprint.changed() == [os.path.realpath(user)]
    user.unlink()
    assert fingerprint.changed() == [os.path.realpath(user)]


def test_channel_frames_messages_and_reports_a_closed_peer() -> None:
    a, b = socket.socketpair()
    left, right = Channel(a), Channel(b)
    left.send(Fork(run_id="r", execute_run_args="{}"))
    left.send(Exited(pid=3, status=-9))
    assert right.recv(1.0) == Fork(run_id="r", execute_run_args="{}")
    assert right.recv(1.0) == Exited(pid=3, status=-9)
    assert right.recv(0.05) is None
    right.send(Forked(pid=4, start_ticks=5))
    assert left.recv(1.0) == Forked(pid=4, start_ticks=5)
    left.close()
    with pytest.raises(ChannelClosedError):
        right.recv(1.0)


def test_files_modified_during_a_preload_count_as_changed(tmp_path: Path) -> None:
    """A file saved between its import and its stamp must not make a stale server look current."""
    module = types.ModuleType("saved_late")
    module.__file__ = str(tmp_path / "saved_late.py")
    Path(module.__file__).write_text("X = 1\n")
    fingerprint = take([module])
    modified = os.stat(module.__file__).st_mtime_ns
    assert fingerprint.distrusting(modified + 1).changed() == []
    assert fingerprint.distrusting(modified).changed() == [os.path.realpath(module.__file__)]


def _origin(python_file: str, working_directory: str | None) -> RepositoryPythonOrigin:
    pointer = FileCodePointer(python_file=python_file, fn_name="defs", working_directory=working_directory)
    return RepositoryPythonOrigin(executable_path=sys.executable, code_pointer=pointer)


def test_runs_work_in_the_code_locations_working_directory(tmp_path: Path) -> None:
    (tmp_path / "definitions.py").write_text("")
    assert code_directory(_origin("definitions.py", str(tmp_path))) == str(tmp_path)
    assert code_directory(_origin("definitions.py", str(tmp_path / "gone"))) is None  # not on this host
    assert code_directory(_origin("definitions.py", None)) is None


def test_a_relative_code_file_is_found_only_in_the_working_directory(tmp_path: Path) -> None:
    """``dagster api grpc -f definitions.py`` records the file as given: found from the directory the server
    was started in, which the origin names as its working directory unless ``-d`` named another."""
    served, elsewhere = tmp_path / "served", tmp_path / "elsewhere"
    served.mkdir()
    elsewhere.mkdir()
    (served / "definitions.py").write_text("")
    assert unreachable_code_file(_origin("definitions.py", str(served))) is None
    assert unreachable_code_file(_origin(str(served / "definitions.py"), str(elsewhere))) is None  # absolute
    reason = unreachable_code_file(_origin("definitions.py", str(elsewhere)))
    assert reason is not None and "'definitions.py'" in reason and str(elsewhere) in reason


def test_an_idle_worker_interrupted_while_it_waits_exits_quietly() -> None:
    """Ctrl-C to ``dg dev`` reaches the whole process group, idle run workers included: a worker waiting for its
    next run has nothing to interrupt and takes the interrupt as the end of its wait (it printed a traceback of
    the wait before). The interrupt comes as Ctrl-C's does, as SIGINT to this process while it waits."""
    from dagster_streamgroup.launcher.child import IDLE, next_run

    ours, servers = socket.socketpair()
    try:
        reader = ours.makefile("rb")
        timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        try:
            waited = next_run(ours, reader)
        except KeyboardInterrupt:
            pytest.fail("the interrupt escaped the idle worker's wait")
        finally:
            timer.cancel()
        assert waited is None
        assert servers.recv(1) == IDLE  # it had said it was idle before it waited
    finally:
        ours.close()
        servers.close()
