"""A run's SQLite event database copied from an empty one holds what Dagster's own holds, and an existing file is
never replaced."""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from dagster_streamgroup import patches
from dagster_streamgroup.patches import run_databases
from tests.patches import run_database


@pytest.fixture
def dagsters_own(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Dagster's own set-up in place (an earlier test of this process may have installed the patch) and no kept
    copy; monkeypatch puts both back afterwards."""
    storage_class = importlib.import_module(run_databases.MODULE).SqliteEventLogStorage
    initdb = storage_class.__dict__["_initdb"]
    monkeypatch.setattr(storage_class, "_initdb", getattr(initdb, patches.ORIGINAL, initdb))
    monkeypatch.setattr(run_databases, "KEPT", run_databases.KeptCopy())
    yield


def test_a_run_database_from_the_copy_holds_what_dagster_builds(tmp_path: Path, dagsters_own: None) -> None:
    run_database.store_first_event(tmp_path / "dagster", "run-1")
    expected = run_database.contents(tmp_path / "dagster" / "run-1.db")
    assert expected[0] and expected[1] and expected[2] == "wal" and expected[3] == 1

    assert run_databases.install() and run_databases.install(), "installing twice is harmless"
    base = tmp_path / "copied"
    for run_id in ("run-1", "run-2"):  # the first builds the kept copy, the second is made from it
        run_database.store_first_event(base, run_id)
        assert run_database.contents(base / f"{run_id}.db") == expected
    assert run_databases.KEPT.content is not None
    assert not [p.name for p in base.iterdir() if p.suffix == ".tmp"], "no temporary file left"
    (tmp_path / "instance").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "instance")) as instance:  # a run end to end on the copy
        result = dg.materialize([dg.asset(name="x")(lambda: 1)], instance=instance)
        assert result.success
        runs = tmp_path / "instance" / "history" / "runs"
        assert run_database.contents(runs / f"{result.run_id}.db")[:3] == expected[:3]
        assert instance.get_latest_materialization_event(dg.AssetKey("x")) is not None


def test_an_existing_file_is_never_replaced(tmp_path: Path, dagsters_own: None) -> None:
    """A file at the run's name (another process opened it first: SQLite creates it empty) stays the same file,
    and Dagster's own path builds the schema in it."""
    assert run_databases.install()
    run_database.store_first_event(tmp_path, "run-0")  # the kept copy exists
    path = tmp_path / "run-1.db"
    path.touch()
    inode = os.stat(path).st_ino
    run_database.store_first_event(tmp_path, "run-1")
    assert os.stat(path).st_ino == inode
    assert run_database.contents(path)[2:] == ("wal", 1)
    assert run_database.contents(path)[:2] == run_database.contents(tmp_path / "run-0.db")[:2]


def test_placing_a_copy_at_a_taken_name_fails_and_leaves_both_untouched(tmp_path: Path) -> None:
    path = tmp_path / "run.db"
    path.write_bytes(b"another process's database")
    assert not run_databases._place(str(path), b"copy")
    assert path.read_bytes() == b"another process's database"
    assert not [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp"], "no temporary file left"
    assert (tmp_path / "run.db").exists()
    assert run_databases._place(str(tmp_path / "new.db"), b"copy")
    assert (tmp_path / "new.db").read_bytes() == b"copy"
