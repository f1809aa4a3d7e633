"""Linearizability of every state store (``bench.store_linearizability``) for a few seconds each, and its check on
histories that break it: a check that cannot fail proves nothing.

Workers load, pause for up to longer than several folds (the stores fold every few writes), and ``save_if``;
the bench runs the same at 100,000 operations per store."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.store_linearizability import (
    ROOT,
    History,
    Pauses,
    Read,
    Settings,
    StoreResult,
    StoreSpec,
    Write,
    check,
    run,
)
from dagster_streamgroup.local.v3io.testing import V3ioServerInfo

SETTINGS = Settings(operations=1_000_000, time_limit_s=3.0, workers=4, pauses=Pauses(max_s=0.05))
"""Bounded by time: 3 s of calls per store, once its worker processes have started."""
FOLD_EVERY_WRITE = 0.0
"""So that a write refused two versions after its load was refused two folds after it."""


def _assert_linearizable(result: StoreResult, *, folds: bool = True) -> None:
    assert result.errors == []
    assert result.anomalies == 0, result.examples
    assert result.accepted >= 20 and result.chain_length == result.accepted
    assert result.refused > 0 and result.max_versions_behind >= 2, "no write was refused two folds after its load"
    if folds:
        assert result.folds >= 10, "folds were not forced often"


def test_the_memory_store_is_linearizable_under_threads() -> None:
    _assert_linearizable(run("memory", StoreSpec("memory"), SETTINGS), folds=False)


def test_the_sqlite_store_is_linearizable_while_it_folds(tmp_path: Path) -> None:
    spec = StoreSpec("sqlite", url=f"sqlite:///{tmp_path / 'state.db'}", fold_fraction=FOLD_EVERY_WRITE)
    _assert_linearizable(run("sqlite", spec, SETTINGS))


@pytest.mark.postgres
def test_the_postgresql_store_is_linearizable_while_it_folds(postgres_url: str) -> None:
    _assert_linearizable(
        run("postgresql", StoreSpec("postgresql", url=postgres_url, fold_fraction=FOLD_EVERY_WRITE), SETTINGS)
    )


@pytest.mark.v3io
def test_the_v3io_store_is_linearizable_while_it_folds(v3io_server: V3ioServerInfo) -> None:
    key = v3io_server.access_key.get_secret_value()
    spec = StoreSpec("v3io", url=f"{v3io_server.endpoint}/bigdata", access_key=key, fold_fraction=FOLD_EVERY_WRITE)
    _assert_linearizable(run("v3io", spec, SETTINGS))


# -- the check on histories built by hand: ms on a line, digests named after the state --------------------


def _read(worker: str, start: int, revision: int, head: str) -> Read:
    return Read(worker, start, start + 1, revision, head, f"d-{head}")


def _write(write_id: str, parent: str, revision: int, start: int, end: int, accepted: bool | None) -> Write:
    return Write(write_id.partition("-")[0], write_id, parent, revision, start, end, accepted, f"d-{write_id}")


def _history(reads: list[Read], writes: list[Write]) -> History:
    return History(root_digest=f"d-{ROOT}", reads=reads, writes=writes)


def test_the_check_passes_a_linearizable_history() -> None:
    history = _history(
        [_read("a", 0, 0, ROOT), _read("b", 1, 0, ROOT), _read("b", 30, 1, "a-1"), _read("a", 40, 2, "b-1")],
        [_write("a-1", ROOT, 0, 10, 20, True), _write("b-1", "a-1", 1, 31, 35, True),
         _write("c-1", ROOT, 0, 15, 25, False)],
    )  # fmt: skip
    verdict = check(history)
    assert verdict.anomalies == [] and verdict.chain_length == 2


def test_the_check_finds_a_write_accepted_after_two_folds_that_no_one_reads() -> None:
    """The bug of the logged stores: ``c`` loaded the root, paused while ``a`` and ``b`` wrote (and folded),
    then its save was accepted; readers go on from ``b``'s state."""
    history = _history(
        [_read("c", 0, 0, ROOT), _read("a", 1, 0, ROOT), _read("b", 12, 1, "a-1"), _read("d", 50, 2, "b-1")],
        [_write("a-1", ROOT, 0, 5, 10, True), _write("b-1", "a-1", 1, 13, 20, True),
         _write("c-1", ROOT, 0, 30, 40, True)],
    )  # fmt: skip
    anomalies = check(history).anomalies
    assert any("2 accepted writes" in a for a in anomalies)
    assert any("accepted after revision 2" in a for a in anomalies)


def test_the_check_finds_a_read_of_a_state_that_never_existed() -> None:
    """A fold between a reader's two statements: the right revision and head, a different state."""
    twice = Read("r", 30, 31, 1, "a-1", "d-a-1-applied-twice")
    history = _history([_read("a", 0, 0, ROOT), twice], [_write("a-1", ROOT, 0, 5, 10, True)])
    assert any("never existed" in a for a in check(history).anomalies)


def test_the_check_finds_a_refused_write_that_is_visible_and_a_lost_one() -> None:
    history = _history(
        [_read("a", 0, 0, ROOT), _read("r", 30, 1, "a-1"), _read("s", 40, 0, ROOT)],
        [_write("a-1", ROOT, 0, 5, 10, False)],
    )
    anomalies = check(history).anomalies
    assert any("read refused write a-1" in a for a in anomalies)
    assert any("no write of revision 1 raced it" in a for a in anomalies)
    lost = _history(
        [_read("a", 0, 0, ROOT), _read("r", 30, 0, ROOT)], [_write("a-1", ROOT, 0, 5, 10, True)]
    )  # accepted, yet a read that starts after it returned does not see it
    assert any("an accepted write lost" in a for a in check(lost).anomalies)
