"""16 processes hammer one state with CAS read-modify-write loops: no acknowledged update may be lost.

The hammer is ``bench.store_contention`` (the benchmark runs the same code at a larger size). Each process
advances its own counter in the shared state; the final state must hold every acknowledged increment,
nothing more, and conflicts must have happened, or the test would prove nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.store_contention import run_contention

PROCESSES = 16
OPS = 12


def _check(backend: str, url: str) -> None:
    result = run_contention({backend: url}, processes=PROCESSES, ops=OPS, time_budget_s=90.0)[backend]
    assert result.errors == ()
    assert result.cas_ok > 0
    assert result.lost_updates == 0
    assert result.phantom_updates == 0
    assert result.final_revision == result.cas_ok
    assert result.cas_conflicts > 0, "no conflicts: the processes never overlapped, the test proved nothing"


@pytest.mark.slow
def test_sqlite_loses_no_update_under_contention(tmp_path: Path) -> None:
    _check("sqlite", f"sqlite:///{tmp_path / 'state.db'}")


@pytest.mark.slow
@pytest.mark.postgres
def test_postgresql_loses_no_update_under_contention(postgres_url: str) -> None:
    _check("postgresql", postgres_url)
