"""``streamgroup local spark-cluster``: starts the master and workers in the foreground, prints what drivers need,
and leaves nothing behind when stopped with SIGTERM; bad options are refused naming the field."""

from __future__ import annotations

import ast
import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from dagster_streamgroup.local import procfs
from dagster_streamgroup.local.spark_connect import stop_process_tree

STREAMGROUP = str(Path(sys.executable).parent / "streamgroup")


@pytest.mark.parametrize(
    ("option", "value", "field"), [("--workers", "0", "workers"), ("--memory", "lots", "worker_memory")]
)
def test_bad_options_name_the_field(option: str, value: str, field: str) -> None:
    done = subprocess.run(
        [STREAMGROUP, "local", "spark-cluster", option, value], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2
    assert re.search(rf"^{field}$", done.stderr, re.MULTILINE), done.stderr


@pytest.mark.spark_cluster
@pytest.mark.slow
def test_the_command_runs_a_cluster_until_sigterm(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    with out.open("wb") as sink:
        command = subprocess.Popen(
            [STREAMGROUP, "local", "spark-cluster", "--workers", "1"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 180
        while "Ctrl-C stops it" not in out.read_text():
            assert command.poll() is None and time.monotonic() < deadline, out.read_text()
            time.sleep(0.2)
        text = out.read_text()
        match = re.search(r"master (spark://127\.0\.0\.1:\d+) \(web UI (http://127\.0\.0\.1:\d+)\)", text)
        assert match is not None, text
        master_url, webui = match.groups()
        assert f"StreamSparkResource(master='{master_url}'" in text
        assert f"streamgroup local spark-connect --master {master_url} --conf spark.executor.cores=1" in text
        with urllib.request.urlopen(f"{webui}/json/", timeout=10) as response:
            status = json.loads(response.read())
        assert (status["url"], status["aliveworkers"]) == (master_url, 1)
        tree = procfs.process_tree(command.pid)
        assert len([pid for pid in tree if procfs.cmdline(pid)[:1] and procfs.cmdline(pid)[0].endswith(b"java")]) == 2

        command.send_signal(signal.SIGTERM)
        assert command.wait(timeout=60) == 0
        deadline = time.monotonic() + 10
        while procfs.alive(tree) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert procfs.alive(tree) == []
    finally:
        stop_process_tree(command.pid, timeout_s=10)


def test_the_docs_examples_are_valid_configurations() -> None:
    """docs/spark_cluster.md's Python examples compile, and each resource it shows validates (no session starts:
    the resource is lazy)."""
    from dagster_streamgroup.dagster.spark_session import StreamSparkResource

    text = (Path(__file__).parents[3] / "docs" / "spark_cluster.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.DOTALL)
    assert len(blocks) == 2
    for block in blocks:
        compile(block, "docs/spark_cluster.md", "exec")
    namespace: dict[str, object] = {}
    shown = []
    for statement in ast.parse(blocks[0]).body:
        exec(compile(ast.Module([statement], []), "docs/spark_cluster.md", "exec"), namespace)
        if isinstance(statement, ast.Assign):
            shown.append(namespace["spark"])
    assert all(isinstance(r, StreamSparkResource) for r in shown)
    targets = [(r.master, r.remote) for r in shown if isinstance(r, StreamSparkResource)]
    assert targets == [
        ("spark://spark-master.internal:7077", None),
        ("yarn", None),
        ("k8s://https://kubernetes.default.svc:443", None),
        ("local[*]", "sc://spark-connect.internal:15002"),
    ]
