"""The store-writer pause of the chaos run (``store_writer_pause``) on a real SQLite logged store: the test hook
holds a write between its load and its ``save_if`` while another writer appends and folds the log past the
held version; the held ``save_if`` is refused (and logged as such), and the held writer's CAS loop then
writes on fresh state, losing no one's write. Without the variable, the hook does nothing."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from dagster_streamgroup import protocol
from dagster_streamgroup.member import CasStats, Transition, update_state
from dagster_streamgroup.protocol import GroupPolicy, GroupState
from dagster_streamgroup.stores import pause_hook
from dagster_streamgroup.stores.sql_log import LoggedSqlStateStore

POLICY = GroupPolicy(heartbeat_interval_s=5, session_timeout_s=20, min_backlog=1, join_grace_s=0)
KEY = "stream|g"


def join(member: str) -> Transition[None]:
    def transition(current: GroupState | None, _at: float) -> tuple[GroupState, None]:
        base = current or protocol.new_group("stream", "g", 1.0)
        return protocol.membership_step(base, member, 2.0, POLICY, ["s0", "s1"]), None

    return transition


def claimed(pause: Path, timeout_s: float = 10.0) -> tuple[Path, dict[str, object]]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for path in pause.parent.glob(f"{pause.name}.held.*"):
            try:
                return path, json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # being written
        time.sleep(0.01)
    raise AssertionError("no write claimed the pause")


def test_a_held_write_is_refused_once_the_log_was_folded_past_it_and_then_writes_on_fresh_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pause = tmp_path / "store-pause"
    monkeypatch.setenv(pause_hook.PAUSE_FILE_ENV, str(pause))
    url = f"sqlite:///{tmp_path / 'state.db'}"
    held_store = LoggedSqlStateStore(url)
    folder = LoggedSqlStateStore(url, min_fold_bytes=1, fold_fraction=0.0)  # folds on every write
    try:
        update_state(folder, KEY, join("a"))
        held_store.load(KEY)  # the held writer's store knows the state as it is now, before the folds
        pause.touch()
        done: list[tuple[None, CasStats]] = []
        writer = threading.Thread(target=lambda: done.append(update_state(held_store, KEY, join("held"))))
        writer.start()
        claim, held = claimed(pause)
        assert held["key"] == KEY and not pause.exists()  # one writer claimed it; the next writes are not held
        for member in ("f0", "f1", "f2"):
            update_state(folder, KEY, join(member))
        assert folder.folds >= 3
        claim.unlink()
        writer.join(30)
        assert not writer.is_alive() and done
        assert done[0][1].conflicts >= 1  # its first attempt was refused, the next one wrote
        results = [json.loads(line) for line in Path(f"{pause}.log").read_text().splitlines()]
        assert results == [{**results[0], "key": KEY, "token": held["token"], "saved": False}]
        state, _ = LoggedSqlStateStore(url).load(KEY)
        assert state is not None and {"a", "held", "f0", "f1", "f2"} <= set(state.members)
    finally:
        held_store.close()
        folder.close()


def test_the_hook_holds_nothing_unless_its_variable_names_a_file_that_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pause = tmp_path / "store-pause"
    pause.touch()
    monkeypatch.delenv(pause_hook.PAUSE_FILE_ENV, raising=False)
    assert pause_hook.hold(KEY, "1") is None and pause.exists()
    monkeypatch.setenv(pause_hook.PAUSE_FILE_ENV, str(tmp_path / "absent"))
    assert pause_hook.hold(KEY, "1") is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store-pause"]
