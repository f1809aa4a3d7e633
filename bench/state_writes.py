"""What a member tick costs the state store, at 200 members x 10,000 shards on PostgreSQL (or v3io).

``python -m bench.state_writes [--store postgresql|v3io] [--members 200] [--shards 10000] [--rounds 3] [--seed 1]``

A temporary PostgreSQL (``dagster_streamgroup.local.postgres``) holds the group state in the SQL store the
product uses (``LoggedSqlStateStore``: each write appends its delta, the log folds into the base row from time
to time). The group cold-starts (every member joins, one assigns every shard), then for ``--rounds`` rounds
every member, in a random order, ticks through the real CAS loop (``member.update_state``): heartbeat,
rebalance, plan the next ranges of its shards; and commits the run it launched the round before. Printed: bytes
the store wrote per tick (mean and p99; heartbeat-only ticks apart, measured in a last round where nothing
new waits), the whole state's size, and the CPU seconds PostgreSQL spent per tick (its processes' /proc
accounting). Targets of the issue: a heartbeat-only tick under 4 KB, a mean tick under 64 KB.

``--store v3io`` runs the same ticks through the v3io KV store (``V3ioStateStore``: the base item plus one log
item per write, folded from time to time) against the project's v3io-compatible server, started on a free
127.0.0.1 port over a temporary directory (its data durable in SQLite, ``synchronous=NORMAL``); the store's CPU
is then that server process's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from dagster_streamgroup import protocol
from dagster_streamgroup.local import procfs
from dagster_streamgroup.local.postgres import temporary_postgres
from dagster_streamgroup.member import update_state
from dagster_streamgroup.protocol import GroupPolicy, GroupState, Launch, Watermark
from dagster_streamgroup.stores.sql_log import LoggedSqlStateStore
from dagster_streamgroup.stores.v3io import V3ioStateStore

KEY = "bench-stream|bench-group"


def _postgres_cpu_s() -> float:
    """CPU seconds of the PostgreSQL server's processes (postmaster and backends) so far."""
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            args = procfs.cmdline(int(entry))
            if args and b"postgres" in args[0]:
                total += procfs.cpu_seconds(int(entry))
        except OSError:
            continue  # the process ended meanwhile
    return total


@contextmanager
def _store(kind: str) -> Iterator[tuple[LoggedSqlStateStore | V3ioStateStore, Callable[[], float]]]:
    """The store under test and a reading of its server's CPU seconds so far."""
    if kind == "postgresql":
        with temporary_postgres(durable=True) as url:
            sql = LoggedSqlStateStore(url)
            try:
                yield sql, _postgres_cpu_s
            finally:
                sql.close()
        return
    from dagster_streamgroup.local.v3io.testing import running_v3io_server
    from dagster_streamgroup.streams.v3io_config import V3ioConnection

    with tempfile.TemporaryDirectory(prefix="bench-v3io-") as tmp, running_v3io_server(Path(tmp)) as server:
        connection = V3ioConnection(endpoint=server.endpoint, container="bigdata", access_key=server.access_key)
        v3io = V3ioStateStore(connection, directory="bench")
        try:
            yield v3io, lambda: procfs.cpu_seconds(server.pid)
        finally:
            v3io.close()


def _p99(values: list[int]) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", choices=["postgresql", "v3io"], default="postgresql")
    parser.add_argument("--members", type=int, default=200)
    parser.add_argument("--shards", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    policy = GroupPolicy(heartbeat_interval_s=5, session_timeout_s=20, min_backlog=1, join_grace_s=0)
    members = [f"m{i:03d}" for i in range(args.members)]
    shard_ids = [f"s{i:05d}" for i in range(args.shards)]

    with _store(args.store) as (store, store_cpu_s):
        clock = [1_000.0]
        store.now = lambda: clock[0]  # type: ignore[method-assign]  # simulated time: no tick waits for real
        start = clock[0]
        state = protocol.sync_shards(protocol.new_group("bench-stream", "bench-group", start), shard_ids, start)
        for member in members:
            state = protocol.heartbeat(state, member, start)
        state = protocol.rebalance(state, members[0], start, policy)
        assert store.save_if(KEY, state, None)
        print(f"cold start: {len(protocol.encode_state(state)):,} bytes of state", file=sys.stderr)

        def tick(member: str, high: int) -> list[Launch]:
            def transition(current: GroupState | None, now: float) -> tuple[GroupState, list[Launch]]:
                assert current is not None
                moved = protocol.membership_step(current, member, now, policy)
                marks = {sid: Watermark(low=0, high=high) for sid in protocol.owned_idle_shards(moved, member)}
                return protocol.plan(moved, member, now, marks, policy)

            launches, _ = update_state(store, KEY, transition, sleep=lambda _s: None)
            return launches

        def commit(launches: list[Launch]) -> None:
            reports = [protocol.report_of(x) for x in launches]

            def transition(current: GroupState | None, _now: float) -> tuple[GroupState | None, object]:
                assert current is not None
                return protocol.commit_run(current, reports)

            update_state(store, KEY, transition, sleep=lambda _s: None)

        pending: dict[str, list[Launch]] = {}
        tick_bytes: list[int] = []
        cpu_before, started = store_cpu_s(), time.monotonic()
        for round_ in range(1, args.rounds + 1):
            for member in rng.sample(members, len(members)):
                clock[0] += 5.0 / args.members
                if member in pending:
                    before = store.bytes_written
                    commit(pending.pop(member))
                    tick_bytes.append(store.bytes_written - before)
                before = store.bytes_written
                launches = tick(member, high=round_ * 100)
                tick_bytes.append(store.bytes_written - before)
                if launches:
                    pending[member] = launches
            print(f"round {round_}: {len(tick_bytes)} writes so far", file=sys.stderr)
        for launches in pending.values():
            commit(launches)
        cpu_s = store_cpu_s() - cpu_before
        writes = len(tick_bytes)
        heartbeat_bytes: list[int] = []
        for member in members:  # nothing new waits: each tick only refreshes its heartbeat
            clock[0] += 5.0 / args.members
            before = store.bytes_written
            leftover = tick(member, high=args.rounds * 100)
            if leftover:  # a shard it took over late still had a range to read: not a heartbeat-only tick
                commit(leftover)
                continue
            heartbeat_bytes.append(store.bytes_written - before)
        elapsed = time.monotonic() - started
        final, _ = store.load(KEY)
        assert final is not None
        state_bytes = len(protocol.encode_state(final))
    figures: dict[str, object] = {
        "store": args.store,
        "members": args.members,
        "shards": args.shards,
        "writes": writes,
        "state_bytes": state_bytes,
        "bytes_written_per_tick_mean": round(statistics.fmean(tick_bytes)),
        "bytes_written_per_tick_p99": _p99(tick_bytes),
        "heartbeat_tick_bytes_mean": round(statistics.fmean(heartbeat_bytes)),
        "heartbeat_tick_bytes_max": max(heartbeat_bytes),
        "store_cpu_s_per_tick": round(cpu_s / writes, 5),
        "store_cpu_s": round(cpu_s, 2),
        "elapsed_s": round(elapsed, 1),
        "targets": {"heartbeat_tick_bytes_max": "< 4096", "bytes_written_per_tick_mean": "< 65536"},
    }
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main()
