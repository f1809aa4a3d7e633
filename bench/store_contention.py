"""CAS contention on one group state: N processes run read-modify-write loops against the same key.

Each process owns one shard entry in the shared state and advances its ``committed`` offset by one per
successful compare-and-set (the state's ``revision`` counts all of them). At the end the state must hold
exactly every acknowledged update: ``lost_updates`` counts acknowledged increments missing from it,
``phantom_updates`` increments reported as conflicts that landed anyway. Conflicts are retried on fresh
state with full-jitter exponential backoff, as members do. The first write races too: every process
starts with create-if-absent.

    python -m bench.store_contention [--processes 16] [--ops 25] [--backends sqlite,postgresql]

Prints one JSON line per backend, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import queue
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

from tenacity import Retrying, retry_if_result, stop_after_attempt, stop_after_delay, wait_random_exponential

from dagster_streamgroup.protocol.state import GroupState, ShardState, evolve
from dagster_streamgroup.stores.base import StateStore, state_key
from dagster_streamgroup.stores.factory import open_store

DEFAULT_PROCESSES = 16
DEFAULT_OPS = 25
DEFAULT_TIME_BUDGET_S = 20.0
START_TIMEOUT_S = 180.0
"""Spawning 16 interpreters on a busy 2-core machine can take a while; the clock starts after it."""


@dataclass(frozen=True)
class Backoff:
    """Full jitter: attempt n sleeps uniform(0, min(cap, base * 2**n)). Defaults are the member's
    (dagster_streamgroup.member.update_state), with more attempts, since the bench wants every op done."""

    base_s: float = 0.02
    cap_s: float = 0.5
    max_attempts: int = 60


@dataclass(frozen=True)
class Target:
    backend: str
    url: str
    key: str


@dataclass(frozen=True)
class WorkerResult:
    phase: int
    worker: str
    cas_ok: int
    cas_conflicts: int
    gave_up: int
    started: float
    finished: float
    error: str | None = None


@dataclass(frozen=True)
class ContentionResult:
    backend: str
    processes: int
    ops_per_process: int
    cas_ok: int
    cas_conflicts: int
    gave_up: int
    lost_updates: int
    phantom_updates: int
    final_revision: int
    elapsed_s: float
    ops_per_s: float
    errors: tuple[str, ...] = ()


def _increment_once(store: StateStore, key: str, worker: str, conflicts: list[int]) -> bool:
    """One CAS attempt, computed from freshly loaded state only: nothing from a failed attempt is reused."""
    state, token = store.load(key)
    if state is None:
        stream, group = key.split("|", 1)
        state = GroupState(stream=stream, group=group, created_at=store.now())
    mine = state.shards.get(worker, ShardState(committed=0))
    advanced = evolve(mine, committed=(mine.committed or 0) + 1)
    new = state.model_copy(update={"shards": {**state.shards, worker: advanced}, "revision": state.revision + 1})
    if store.save_if(key, new, token):
        return True
    conflicts[0] += 1
    return False


def _hammer(store: StateStore, key: str, worker: str, ops: int, deadline: float, backoff: Backoff) -> tuple[int, ...]:
    conflicts, ok, gave_up = [0], 0, 0
    for _ in range(ops):
        if time.monotonic() > deadline:
            break
        retrying = Retrying(
            retry=retry_if_result(lambda written: not written),
            wait=wait_random_exponential(multiplier=backoff.base_s, max=backoff.cap_s),
            stop=stop_after_attempt(backoff.max_attempts) | stop_after_delay(max(0.0, deadline - time.monotonic())),
            retry_error_callback=lambda _state: False,
        )
        if retrying(_increment_once, store, key, worker, conflicts):
            ok += 1
        else:
            gave_up += 1
    return ok, conflicts[0], gave_up


def _worker(
    worker: str, targets: list[Target], ops: int, budget_s: float, backoff: Backoff, barriers: list[Barrier], out: Any
) -> None:
    """Runs every phase (one per backend) in one process, so interpreters are spawned once."""
    for phase, (target, barrier) in enumerate(zip(targets, barriers, strict=True)):
        started = time.monotonic()
        waited = False
        try:
            store = open_store(target.url)
            store.load(target.key)  # connect before the start line, so the timing covers CAS work only
            barrier.wait(timeout=START_TIMEOUT_S)
            waited = True
            started = time.monotonic()
            ok, conflicts, gave_up = _hammer(store, target.key, worker, ops, started + budget_s, backoff)
            out.put(WorkerResult(phase, worker, ok, conflicts, gave_up, started, time.monotonic()))
            store.close()
        except Exception as exc:
            out.put(WorkerResult(phase, worker, 0, 0, 0, started, time.monotonic(), repr(exc)))
            if not waited:
                with contextlib.suppress(threading.BrokenBarrierError):
                    barrier.wait(timeout=START_TIMEOUT_S)


def run_contention(
    urls: dict[str, str],
    *,
    processes: int = DEFAULT_PROCESSES,
    ops: int = DEFAULT_OPS,
    time_budget_s: float = DEFAULT_TIME_BUDGET_S,
    backoff: Backoff = Backoff(),
    on_result: Any = None,
) -> dict[str, ContentionResult]:
    """Hammer one fresh key of each store in ``urls`` ({backend: url}), one backend after the other, from
    ``processes`` spawned processes. ``on_result(result)`` is called as each backend finishes."""
    run = uuid.uuid4().hex[:12]
    targets = [Target(b, url, state_key(f"contention-{run}", b)) for b, url in urls.items()]
    stores = [open_store(t.url) for t in targets]  # creates the tables once, before the processes race
    ctx = mp.get_context("spawn")
    barriers = [ctx.Barrier(processes) for _ in targets]
    out = ctx.Queue()
    workers = [
        ctx.Process(
            target=_worker, args=(f"w{i:02d}", targets, ops, time_budget_s, backoff, barriers, out), daemon=True
        )
        for i in range(processes)
    ]
    results: dict[str, ContentionResult] = {}
    by_phase: dict[int, list[WorkerResult]] = {i: [] for i in range(len(targets))}
    try:
        for proc in workers:
            proc.start()
        give_up_at = time.monotonic() + len(targets) * (START_TIMEOUT_S + time_budget_s + 30)
        phase = 0
        while phase < len(targets) and time.monotonic() < give_up_at:
            try:
                item: WorkerResult = out.get(timeout=1.0)
                by_phase[item.phase].append(item)
            except queue.Empty:
                if not any(p.is_alive() for p in workers):
                    give_up_at = 0.0
            while phase < len(targets) and (len(by_phase[phase]) == processes or give_up_at == 0.0):
                result = _summarize(targets[phase], stores[phase], by_phase[phase], processes, ops)
                results[targets[phase].backend] = result
                if on_result is not None:
                    on_result(result)
                phase += 1
    finally:
        for proc in workers:
            if proc.pid is None:  # never started
                continue
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
        for store in stores:
            store.close()
    for target, store in zip(targets, stores, strict=True):
        if target.backend not in results:
            results[target.backend] = _summarize(target, store, by_phase[targets.index(target)], processes, ops)
    return results


def _summarize(
    target: Target, store: StateStore, reports: list[WorkerResult], processes: int, ops: int
) -> ContentionResult:
    final, _ = store.load(target.key)
    stored = {w: s.committed or 0 for w, s in final.shards.items()} if final is not None else {}
    errors = [f"{r.worker}: {r.error}" for r in reports if r.error]
    if len(reports) < processes:
        errors.append(f"{processes - len(reports)} worker(s) reported nothing")
    cas_ok = sum(r.cas_ok for r in reports)
    lost = sum(max(0, r.cas_ok - stored.get(r.worker, 0)) for r in reports)
    phantom = sum(max(0, stored.get(r.worker, 0) - r.cas_ok) for r in reports)
    # The revision counts every write, so a write that erased another worker's entry shows here too.
    final_revision = final.revision if final is not None else 0
    lost = max(lost, cas_ok - final_revision)
    elapsed = max((r.finished for r in reports), default=0.0) - min((r.started for r in reports), default=0.0)
    return ContentionResult(
        backend=target.backend,
        processes=processes,
        ops_per_process=ops,
        cas_ok=cas_ok,
        cas_conflicts=sum(r.cas_conflicts for r in reports),
        gave_up=sum(r.gave_up for r in reports),
        lost_updates=lost,
        phantom_updates=phantom,
        final_revision=final_revision,
        elapsed_s=round(elapsed, 3),
        ops_per_s=round(cas_ok / elapsed, 1) if elapsed > 0 else 0.0,
        errors=tuple(errors),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.store_contention", description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=DEFAULT_PROCESSES)
    parser.add_argument("--ops", type=int, default=DEFAULT_OPS, help="successful updates each process aims for")
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--time-budget", type=float, default=DEFAULT_TIME_BUDGET_S, help="seconds per backend, at most")
    parser.add_argument("--postgres-url", default=None, help="use this server instead of a temporary one")
    args = parser.parse_args(argv)
    if args.processes < 1 or args.ops < 1:
        parser.error("--processes and --ops must be >= 1 (--processes 1 measures an uncontended store)")
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(backends) - {"sqlite", "postgresql"}
    if unknown:
        parser.error(f"--backends: unknown {sorted(unknown)}; choose from sqlite, postgresql")

    summary: dict[str, dict[str, Any]] = {}
    total_lost = 0

    def report(result: ContentionResult) -> None:
        nonlocal total_lost
        line = asdict(result)
        line["errors"] = list(result.errors)
        line["load_avg_1m"] = round(os.getloadavg()[0], 1)  # other work on the machine skews ops_per_s
        print(json.dumps(line), flush=True)
        keys = ("backend", "processes", "cas_ok", "cas_conflicts", "lost_updates", "ops_per_s")
        summary[result.backend] = {k: line[k] for k in keys}
        total_lost += result.lost_updates + result.phantom_updates

    with contextlib.ExitStack() as stack:
        urls: dict[str, str] = {}
        if "sqlite" in backends:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="streamgroup-bench-"))
            urls["sqlite"] = f"sqlite:///{Path(tmp) / 'state.db'}"
        if "postgresql" in backends:
            skipped = _postgres(args.postgres_url, stack, urls)
            if skipped:
                print(json.dumps({"backend": "postgresql", "skipped": skipped}), flush=True)
                summary["postgresql"] = {"backend": "postgresql", "skipped": skipped}
        if urls:
            run_contention(urls, processes=args.processes, ops=args.ops, time_budget_s=args.time_budget,
                           on_result=report)  # fmt: skip
    print(json.dumps({"processes": args.processes, "lost_updates": total_lost, "backends": summary}), flush=True)
    return 0 if total_lost == 0 else 1


def _postgres(url: str | None, stack: contextlib.ExitStack, urls: dict[str, str]) -> str | None:
    """Add the PostgreSQL URL (given, or a temporary durable server); the reason when it cannot be had."""
    if url:
        urls["postgresql"] = url
        return None
    from dagster_streamgroup.local.postgres import PostgresNotFoundError, temporary_postgres

    try:
        urls["postgresql"] = stack.enter_context(temporary_postgres(durable=True))
    except PostgresNotFoundError as exc:
        return f"PostgreSQL server binaries not found (install Debian's postgresql package): {exc}"
    return None


if __name__ == "__main__":
    sys.exit(main())
