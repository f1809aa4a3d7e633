"""Linearizability of every state store, with writers that pause between load and save_if while others fold.

Several processes (threads for the in-process memory store) share one key of one store. Each repeats: load;
then, most of the time, a write: a random pause (none, or up to ``--max-pause-ms``, longer than several folds,
which the store is set to do every few writes), and ``save_if`` of the loaded state with one more event, a write
id no other write has, and the revision one above the loaded one. A share of the requests the stores make to
their database or server (``--pause-inside``) is preceded by such a pause too, so races inside one call (between
a store's checks and its write, between two of its reads) are run into as well. Every call is recorded with its
start and end on the host's monotonic clock (one clock for every process). Then the history is checked:

- the accepted writes form one chain: exactly one accepted write per revision 1..N, each extending the write
  that produced the state it loaded (so a write accepted on a version others had moved past shows up);
- every read (each load, the ones before writes too) returns the state the chain has at its revision, byte
  for byte (a digest of the whole state): no state that never existed, no change applied twice;
- an accepted write is seen by every read that starts after its ``save_if`` returned, and no accepted write
  starts after its version was already superseded; reads never go back in time, nor see a write that had not
  yet started;
- no refused write is visible: no read returns it, no write extends it; and each refused write had a cause,
  an accepted write of the revision it tried that started before it returned.

``anomalies`` counts the violations; it must be 0.

    python -m bench.store_linearizability [--stores memory,sqlite,postgresql,v3io] [--operations 100000]
        [--time-limit 900] [--workers 6] [--max-pause-ms 50] [--pause-inside 0.1] [--fold-fraction 0.02]

``--operations`` counts store calls (loads and saves) per store; ``--time-limit`` bounds each store's run in
seconds (the run stops at whichever comes first). PostgreSQL and the v3io server are started on free 127.0.0.1
ports over temporary directories (``--postgres-url`` uses a server of yours). Prints one JSON line per store,
then one JSON object as the last line with ``operations`` and ``anomalies`` per store.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import hashlib
import json
import multiprocessing as mp
import random
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

from sqlalchemy import event

from dagster_streamgroup.protocol.state import (
    MAX_EVENTS,
    EventKind,
    GroupEvent,
    GroupState,
    ShardState,
    evolve,
)
from dagster_streamgroup.stores.base import StateStore, StoreUnavailableError, state_key
from dagster_streamgroup.stores.memory import MemoryStore

STORES = ("memory", "sqlite", "postgresql", "v3io")
DEFAULT_OPERATIONS = 100_000
DEFAULT_TIME_LIMIT_S = 900.0
DEFAULT_WORKERS = 6
DEFAULT_MAX_PAUSE_S = 0.05
DEFAULT_INSIDE_SHARE = 0.1
DEFAULT_FOLD_FRACTION = 0.02
"""Of a state of about 20 kB (200 events): a fold every two or three writes."""
WRITE_SHARE = 0.75
"""Of the loads, the share followed by a write (the others are reads only)."""
NO_PAUSE_SHARE = 0.3
MIN_PAUSE_S = 20e-6
ROOT = "root"
"""The write id of the state every run starts from."""
SHOWN_ANOMALIES = 20
START_TIMEOUT_S = 180.0
_SCRATCH = "/dev/shm" if Path("/dev/shm").is_dir() else None
"""Where the SQLite file and the v3io server's data go: memory, since the check is of ordering, not durability
(a sync per commit would only slow the run down)."""


# -- the history ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Read:
    """A load: what it returned (the state's revision, the id of the write that produced it, its digest)."""

    worker: str
    start: int
    end: int
    revision: int
    head: str
    digest: str


@dataclass(frozen=True)
class Write:
    """A save_if of the state ``parent`` (at ``parent_revision``) extended by write ``write_id``. ``accepted`` is
    None when the call raised: the outcome is unknown."""

    worker: str
    write_id: str
    parent: str
    parent_revision: int
    start: int
    end: int
    accepted: bool | None
    digest: str

    @property
    def revision(self) -> int:
        return self.parent_revision + 1


@dataclass
class History:
    root_digest: str
    reads: list[Read] = field(default_factory=list)
    writes: list[Write] = field(default_factory=list)
    folds: int = 0
    errors: list[str] = field(default_factory=list)

    def extend(self, other: History) -> None:
        self.reads.extend(other.reads)
        self.writes.extend(other.writes)
        self.folds += other.folds
        self.errors.extend(other.errors)


def digest(state: GroupState) -> str:
    """A digest of everything the state holds, independent of the order its mappings were built in."""
    canonical = json.dumps(state.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:20]


def head_of(state: GroupState) -> str:
    """The id of the write that produced ``state``: its newest event's detail (each write appends one)."""
    return state.events[-1].detail if state.events else ROOT


def extended(state: GroupState, write_id: str, worker: str) -> GroupState:
    """``state`` with write ``write_id`` of ``worker``: one more event, the worker's counter one higher."""
    mine = state.shards.get(worker, ShardState(committed=0))
    event = GroupEvent(kind=EventKind.LEFT, at=float(state.revision + 1), member_id=worker, detail=write_id)
    return state.model_copy(
        update={
            "revision": state.revision + 1,
            "shards": {**state.shards, worker: evolve(mine, committed=(mine.committed or 0) + 1)},
            "events": (*state.events, event)[-MAX_EVENTS:],
        }
    )


# -- the check -----------------------------------------------------------------------------------------------


@dataclass
class Verdict:
    anomalies: list[str] = field(default_factory=list)
    chain_length: int = 0
    max_versions_behind: int = 0
    """Of the refused writes: how many versions the chain had moved on between their load and their save."""

    def add(self, text: str) -> None:
        self.anomalies.append(text)


def check(history: History) -> Verdict:
    """Every violation of linearizability the history shows (see the module docstring)."""
    verdict = Verdict()
    chain = _chain(history, verdict)
    verdict.chain_length = len(chain) - 1
    _check_reads(history, chain, verdict)
    _check_writes(history, chain, verdict)
    return verdict


def _accepted(history: History) -> list[Write]:
    """The accepted writes, with those of unknown outcome that some read or write shows were applied."""
    seen = {r.head for r in history.reads} | {w.parent for w in history.writes}
    return [w for w in history.writes if w.accepted or (w.accepted is None and w.write_id in seen)]


def _chain(history: History, verdict: Verdict) -> list[Write | None]:
    """The accepted writes by revision (index 0: the root), noting forks, gaps and writes that extend another
    state than the chain's."""
    by_revision: dict[int, list[Write]] = defaultdict(list)
    for write in _accepted(history):
        by_revision[write.revision].append(write)
    chain: list[Write | None] = [None]
    for revision in range(1, max(by_revision, default=0) + 1):
        writes = by_revision.get(revision, [])
        if len(writes) != 1:
            ids = sorted(w.write_id for w in writes)
            verdict.add(f"revision {revision}: {len(writes)} accepted writes {ids[:4]} (one chain has exactly one)")
        if not writes:
            chain.append(None)
            continue
        write = min(writes, key=lambda w: w.end)
        previous = chain[revision - 1]
        expected = previous.write_id if previous is not None else ROOT
        for other in writes:
            if other.parent != expected:
                verdict.add(
                    f"accepted write {other.write_id} at revision {revision} extends {other.parent}, "
                    f"not {expected}, the chain's revision {revision - 1}"
                )
        chain.append(write)
    return chain


def _link(chain: list[Write | None], revision: int, root_digest: str) -> tuple[str, str] | None:
    """(write id, digest) of the chain's state at ``revision``; None past its end or at a gap."""
    if revision == 0:
        return ROOT, root_digest
    if revision >= len(chain) or chain[revision] is None:
        return None
    write = chain[revision]
    assert write is not None
    return write.write_id, write.digest


def _check_reads(history: History, chain: list[Write | None], verdict: Verdict) -> None:
    refused = {w.write_id for w in history.writes if w.accepted is False}
    for read in history.reads:
        if read.head in refused:
            verdict.add(f"{read.worker} read refused write {read.head} at revision {read.revision}")
        link = _link(chain, read.revision, history.root_digest)
        if link != (read.head, read.digest):
            verdict.add(
                f"{read.worker} read revision {read.revision} as write {read.head} (digest {read.digest}); "
                f"the chain holds {link}: a state that never existed"
            )
        written = chain[read.revision] if 0 < read.revision < len(chain) else None
        if written is not None and written.start > read.end:
            verdict.add(f"{read.worker} read write {written.write_id} before it started")
    for write in history.writes:
        if write.parent in refused:
            verdict.add(f"write {write.write_id} extends refused write {write.parent}")
    _no_going_back(history, chain, verdict)


def _no_going_back(history: History, chain: list[Write | None], verdict: Verdict) -> None:
    """A read that starts after an accepted write (or another read) returned sees that revision or a later."""
    known = [(w.end, w.revision) for w in chain[1:] if w is not None and w.accepted]
    known += [(r.end, r.revision) for r in history.reads]
    known.sort()
    ends = [end for end, _ in known]
    highest = _running_max([revision for _, revision in known])
    for read in history.reads:
        before = bisect.bisect_left(ends, read.start)
        if before and highest[before - 1] > read.revision:
            verdict.add(
                f"{read.worker} read revision {read.revision} after revision {highest[before - 1]} was seen: "
                "an accepted write lost, or a stale read"
            )


def _check_writes(history: History, chain: list[Write | None], verdict: Verdict) -> None:
    accepted = sorted((w for w in chain[1:] if w is not None), key=lambda w: w.end)
    ends = [w.end for w in accepted]
    highest = _running_max([w.revision for w in accepted])
    for write in history.writes:
        before = bisect.bisect_left(ends, write.start)
        newest = highest[before - 1] if before else 0
        if write.accepted and newest >= write.revision:
            verdict.add(
                f"write {write.write_id} from revision {write.parent_revision} was accepted after revision "
                f"{newest} had been written"
            )
        if write.accepted is False:
            verdict.max_versions_behind = max(verdict.max_versions_behind, newest - write.parent_revision)
            rival = chain[write.revision] if write.revision < len(chain) else None
            if rival is None or rival.start > write.end:
                verdict.add(f"write {write.write_id} was refused, yet no write of revision {write.revision} raced it")


def _running_max(values: Sequence[int]) -> list[int]:
    out, top = [], 0
    for value in values:
        top = max(top, value)
        out.append(top)
    return out


# -- the workers ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StoreSpec:
    """How a worker opens the store under test (plain values: it crosses to spawned processes)."""

    kind: str
    url: str = ""
    access_key: str = ""
    directory: str = "linearizability"
    min_fold_bytes: int = 0
    fold_fraction: float = DEFAULT_FOLD_FRACTION


@dataclass(frozen=True)
class Pauses:
    """Where workers pause: between load and save_if (``max_s``), and, in a share of the requests a store makes
    to its database or server (``inside_share``), inside a call: between a store's own reads, between its checks
    and its write, where a one-call race hides."""

    max_s: float = DEFAULT_MAX_PAUSE_S
    inside_share: float = DEFAULT_INSIDE_SHARE

    def draw(self, rng: random.Random) -> float:
        """None a third of the time; else log-uniform up to ``max_s``, so short and long pauses both come."""
        if rng.random() < NO_PAUSE_SHARE or self.max_s <= MIN_PAUSE_S:
            return 0.0
        return float(MIN_PAUSE_S * (self.max_s / MIN_PAUSE_S) ** rng.random())


@dataclass(frozen=True)
class Settings:
    operations: int = DEFAULT_OPERATIONS
    time_limit_s: float = DEFAULT_TIME_LIMIT_S
    workers: int = DEFAULT_WORKERS
    pauses: Pauses = Pauses()
    seed: int = 1


def open_spec(spec: StoreSpec) -> StateStore:
    if spec.kind in {"sqlite", "postgresql"}:
        from dagster_streamgroup.stores.sql_log import LoggedSqlStateStore

        return LoggedSqlStateStore(spec.url, min_fold_bytes=spec.min_fold_bytes, fold_fraction=spec.fold_fraction)
    if spec.kind == "v3io":
        from dagster_streamgroup.stores.v3io import V3ioStateStore
        from dagster_streamgroup.streams.v3io_config import V3ioConnection

        endpoint, _, container = spec.url.rpartition("/")
        connection = V3ioConnection(endpoint=endpoint, container=container, access_key=spec.access_key)
        return V3ioStateStore(
            connection, directory=spec.directory, min_fold_bytes=spec.min_fold_bytes, fold_fraction=spec.fold_fraction
        )
    raise ValueError(f"no store {spec.kind!r} to open in a worker")


def pause_inside(store: StateStore, pauses: Pauses, rng: random.Random) -> None:
    """Make ``store`` pause before a share of its requests (each SQL statement, each v3io request)."""

    def maybe_pause(*_args: Any) -> None:
        if rng.random() < pauses.inside_share:
            time.sleep(pauses.draw(rng))

    engine = getattr(store, "_engine", None)
    if engine is not None:
        event.listen(engine, "before_cursor_execute", maybe_pause)
        return
    call = getattr(store, "_call", None)
    if call is not None:

        def paused_call(*args: Any, **kwargs: Any) -> Any:
            maybe_pause()
            return call(*args, **kwargs)

        store._call = paused_call  # type: ignore[attr-defined]


def work(store: StateStore, key: str, worker: str, quota: int, deadline: float, pauses: Pauses, seed: int) -> History:
    """``quota`` store calls (or until ``deadline``, monotonic seconds) by one worker, recorded."""
    rng = random.Random(seed)
    history = History(root_digest="")
    calls = writes = 0
    while calls < quota and time.monotonic() < deadline:
        calls += 1
        start = time.monotonic_ns()
        try:
            state, token = store.load(key)
        except StoreUnavailableError as exc:
            history.errors.append(f"{worker} load: {exc}")
            continue
        end = time.monotonic_ns()
        if state is None:
            raise RuntimeError(f"{worker}: the state of {key!r} vanished")
        history.reads.append(Read(worker, start, end, state.revision, head_of(state), digest(state)))
        if rng.random() >= WRITE_SHARE or calls >= quota:
            continue
        writes += 1
        write_id = f"{worker}-{writes}"
        new = extended(state, write_id, worker)
        time.sleep(pauses.draw(rng))
        calls += 1
        start = time.monotonic_ns()
        accepted: bool | None
        try:
            accepted = store.save_if(key, new, token)
        except StoreUnavailableError as exc:
            history.errors.append(f"{worker} save: {exc}")
            accepted = None
        end = time.monotonic_ns()
        history.writes.append(
            Write(worker, write_id, head_of(state), state.revision, start, end, accepted, digest(new))
        )
    history.folds = int(getattr(store, "folds", 0))
    return history


_start_line: list[Barrier] = []
"""Set in each worker process: every worker starts its calls once all are connected."""


def _join_start_line(barrier: Barrier) -> None:
    _start_line.append(barrier)


def _work_in_process(
    spec: StoreSpec, key: str, worker: str, quota: int, budget_s: float, pauses: Pauses, seed: int
) -> History:
    """One worker in a process of its own: connected before the start line, so the budget covers calls only
    (starting interpreters on a busy machine takes seconds)."""
    store = open_spec(spec)
    try:
        store.load(key)
        _start_line[0].wait(timeout=START_TIMEOUT_S)
        pause_inside(store, pauses, random.Random(seed + 1))
        return work(store, key, worker, quota, time.monotonic() + budget_s, pauses, seed)
    finally:
        store.close()


# -- a run ---------------------------------------------------------------------------------------------------


@dataclass
class StoreResult:
    store: str
    operations: int
    anomalies: int
    reads: int
    writes: int
    accepted: int
    refused: int
    unknown: int
    folds: int
    chain_length: int
    max_versions_behind: int
    elapsed_s: float
    examples: list[str]
    errors: list[str]


def _first_state(key: str) -> GroupState:
    stream, group = key.split("|", 1)
    return GroupState(stream=stream, group=group, created_at=1.0)


def run_store(
    name: str, spec: StoreSpec | None, settings: Settings, *, opened: StateStore | None = None
) -> StoreResult:
    """Race ``settings.workers`` workers on a fresh key of one store and check the history.

    ``spec`` opens the store in each spawned process; without it, ``opened`` (the memory store) is shared by
    threads of this process."""
    key = state_key(f"linearizability-{uuid.uuid4().hex[:12]}", name)
    first = _first_state(key)
    owner = opened if opened is not None else open_spec(_required(spec))
    try:
        if not owner.save_if(key, first, None):
            raise RuntimeError(f"{name}: the fresh key {key!r} exists already")
    finally:
        if opened is None:
            owner.close()
    history = History(root_digest=digest(first))
    quota = -(-settings.operations // settings.workers)
    seeds = _seeds(settings, name)
    started = time.monotonic()
    if opened is not None:
        parts = _threads(opened, key, quota, settings, seeds)
    else:
        parts = _processes(_required(spec), key, quota, settings, seeds)
    for part in parts:
        history.extend(part)
    elapsed = time.monotonic() - started
    verdict = check(history)
    writes = history.writes
    return StoreResult(
        store=name,
        operations=len(history.reads) + len(writes) + len(history.errors),
        anomalies=len(verdict.anomalies),
        reads=len(history.reads),
        writes=len(writes),
        accepted=sum(1 for w in writes if w.accepted),
        refused=sum(1 for w in writes if w.accepted is False),
        unknown=sum(1 for w in writes if w.accepted is None),
        folds=history.folds,
        chain_length=verdict.chain_length,
        max_versions_behind=verdict.max_versions_behind,
        elapsed_s=round(elapsed, 1),
        examples=verdict.anomalies[:SHOWN_ANOMALIES],
        errors=history.errors[:SHOWN_ANOMALIES],
    )


def _required(spec: StoreSpec | None) -> StoreSpec:
    if spec is None:
        raise ValueError("a store to open in each worker, or one opened store for threads")
    return spec


def _seeds(settings: Settings, name: str) -> list[int]:
    rng = random.Random(f"{settings.seed}-{name}")
    return [rng.randrange(2**32) for _ in range(settings.workers)]


def _threads(store: StateStore, key: str, quota: int, settings: Settings, seeds: list[int]) -> list[History]:
    deadline = time.monotonic() + settings.time_limit_s
    out: list[History] = []
    lock = threading.Lock()

    def one(worker: str, seed: int) -> None:
        part = work(store, key, worker, quota, deadline, settings.pauses, seed)
        with lock:
            out.append(part)

    threads = [threading.Thread(target=one, args=(f"w{i}", seed), daemon=True) for i, seed in enumerate(seeds)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return out


def _processes(spec: StoreSpec, key: str, quota: int, settings: Settings, seeds: list[int]) -> list[History]:
    ctx = mp.get_context("spawn")
    start_line = ctx.Barrier(settings.workers)
    with ProcessPoolExecutor(settings.workers, ctx, _join_start_line, (start_line,)) as pool:
        futures: list[Future[History]] = [
            pool.submit(_work_in_process, spec, key, f"w{i}", quota, settings.time_limit_s, settings.pauses, seed)
            for i, seed in enumerate(seeds)
        ]
        return [future.result() for future in futures]


# -- the command ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def store_specs(
    names: Sequence[str], *, fold_fraction: float, postgres_url: str | None = None
) -> Iterator[dict[str, StoreSpec | str]]:
    """The stores to run, by name: a spec to open in workers, or the reason the store is skipped. Starts (and
    stops) the temporary servers they need."""
    specs: dict[str, StoreSpec | str] = {}
    with contextlib.ExitStack() as stack:
        for name in names:
            specs[name] = _spec(name, stack, fold_fraction, postgres_url)
        yield specs


def _spec(name: str, stack: contextlib.ExitStack, fold_fraction: float, postgres_url: str | None) -> StoreSpec | str:
    if name == "memory":
        return StoreSpec("memory")
    if name == "sqlite":
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="streamgroup-linearizability-", dir=_SCRATCH))
        return StoreSpec("sqlite", url=f"sqlite:///{Path(tmp) / 'state.db'}", fold_fraction=fold_fraction)
    if name == "postgresql":
        if postgres_url:
            return StoreSpec("postgresql", url=postgres_url, fold_fraction=fold_fraction)
        from dagster_streamgroup.local.postgres import PostgresNotFoundError, temporary_postgres

        try:
            url = stack.enter_context(temporary_postgres(durable=False))
        except PostgresNotFoundError as exc:
            return f"PostgreSQL server binaries not found (install Debian's postgresql package): {exc}"
        return StoreSpec("postgresql", url=url, fold_fraction=fold_fraction)
    from dagster_streamgroup.local.v3io.testing import running_v3io_server

    tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="streamgroup-linearizability-v3io-", dir=_SCRATCH))
    server = stack.enter_context(running_v3io_server(Path(tmp)))
    return StoreSpec("v3io", url=f"{server.endpoint}/bigdata", access_key=server.access_key.get_secret_value(),
                     fold_fraction=fold_fraction)  # fmt: skip


def run(name: str, spec: StoreSpec, settings: Settings) -> StoreResult:
    """One store's run: threads over one memory store, or spawned processes over any other."""
    if spec.kind == "memory":
        return run_store(name, None, settings, opened=MemoryStore(time.time))
    return run_store(name, spec, settings)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.store_linearizability", description=__doc__.splitlines()[0])
    parser.add_argument("--stores", default=",".join(STORES), help=f"comma-separated, of {', '.join(STORES)}")
    parser.add_argument("--operations", type=int, default=DEFAULT_OPERATIONS, help="store calls per store")
    parser.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT_S, help="seconds per store, at most")
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS, help="processes (threads for memory)")
    parser.add_argument("--max-pause-ms", type=float, default=DEFAULT_MAX_PAUSE_S * 1000)
    parser.add_argument("--pause-inside", type=float, default=DEFAULT_INSIDE_SHARE,
                        help="share of a store's requests preceded by a pause (0: between calls only)")  # fmt: skip
    parser.add_argument("--fold-fraction", type=float, default=DEFAULT_FOLD_FRACTION,
                        help="fold once the log weighs this share of the state (folds forced often)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--postgres-url", default=None, help="use this server instead of a temporary one")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.stores.split(",") if n.strip()]
    unknown = sorted(set(names) - set(STORES))
    if unknown:
        parser.error(f"--stores: unknown {unknown}; choose from {', '.join(STORES)}")
    if args.operations < 1 or args.workers < 1 or args.time_limit <= 0:
        parser.error("--operations, --workers and --time-limit must be positive")
    pauses = Pauses(args.max_pause_ms / 1000, args.pause_inside)
    settings = Settings(args.operations, args.time_limit, args.workers, pauses, args.seed)
    summary: dict[str, dict[str, Any]] = {}
    with store_specs(names, fold_fraction=args.fold_fraction, postgres_url=args.postgres_url) as specs:
        for name, spec in specs.items():
            if isinstance(spec, str):
                summary[name] = {"skipped": spec}
                print(json.dumps({"store": name, "skipped": spec}), flush=True)
                continue
            result = run(name, spec, settings)
            print(json.dumps(asdict(result)), flush=True)
            summary[name] = {"operations": result.operations, "anomalies": result.anomalies}
    total = sum(s.get("anomalies", 0) for s in summary.values())
    print(json.dumps({"anomalies": total, "stores": summary}), flush=True)
    return 0 if total == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
