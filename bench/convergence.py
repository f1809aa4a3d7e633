"""Convergence of the group protocol, measured with the seeded simulator.

Default: 200 members x 10,000 shards cold-started together (ticks_to_balance), then one member killed
(ticks_to_failover), the planning cost of every member tick at that size (max_tick_ms: CPU time of the
pure transitions, so a noisy machine's preemption is not counted), what each write would cost as a delta
from the state before it (``protocol/delta.py``: mean and p99 bytes, heartbeat-only writes, against the whole
state's size), and >= 1,000 small randomized fault scenarios checked for double owners and every other
invariant.
Run: python -m bench.convergence [--members 200 --shards 10000 --scenarios 1000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from dagster_streamgroup.protocol import GroupPolicy
from dagster_streamgroup.simulation import SimConfig, Simulation, random_scenario


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--members", type=int, default=200)
    parser.add_argument("--shards", type=int, default=10_000)
    parser.add_argument("--scenarios", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)

    policy = GroupPolicy(heartbeat_interval_s=5, session_timeout_s=20, max_records_per_run=10**9)
    big = SimConfig(
        members=args.members,
        shards=args.shards,
        seed=args.seed,
        policy=policy,
        duration_s=60,
        quiet_s=0,
        crash_at_s=31,
        run_s=(2, 8),
        produce_per_s=0.002,
        initial_backlog=0,
        cas_latency_s=(0.002, 0.02),
        measure_deltas=True,
    )
    started = time.perf_counter()
    result = Simulation(big).run()
    big_s = time.perf_counter() - started
    print(
        f"large group: {args.members} members x {args.shards} shards: "
        f"balance after {result.ticks_to_balance:.2f} ticks, failover after {result.ticks_to_failover:.2f} ticks "
        f"(session timeout {policy.session_timeout_s / policy.heartbeat_interval_s:.0f} ticks), "
        f"{result.member_ticks} member ticks, max {result.max_tick_ms:.1f} ms CPU, "
        f"{result.cas_conflicts} CAS conflicts, {len(result.violations)} violations ({big_s:.0f} s)",
        file=sys.stderr,
    )

    started = time.perf_counter()
    violations = 0
    double_owner = 0
    failed: list[int] = []
    conflicts = 0
    for seed in range(args.seed, args.seed + args.scenarios):
        small = Simulation(random_scenario(seed)).run()
        conflicts += small.cas_conflicts
        if small.violations:
            violations += len(small.violations)
            double_owner += small.double_owner_violations
            failed.append(seed)
    print(
        f"{args.scenarios} random fault scenarios: {violations} invariant violations, {conflicts} CAS conflicts "
        f"({time.perf_counter() - started:.0f} s)",
        file=sys.stderr,
    )
    figures: dict[str, object] = {
        "members": args.members,
        "shards": args.shards,
        "ticks_to_balance": round(result.ticks_to_balance or -1, 2),
        "ticks_to_failover": round(result.ticks_to_failover or -1, 2),
        "session_timeout_ticks": policy.session_timeout_s / policy.heartbeat_interval_s,
        "max_tick_ms": round(result.max_tick_ms, 2),
        "median_tick_ms": round(statistics.median(result.tick_ms), 2) if result.tick_ms else None,
        "large_group_violations": len(result.violations),
        "double_owner_violations": double_owner + result.double_owner_violations,
        "invariant_violations": violations + len(result.violations),
        "state_bytes_median": int(statistics.median(result.state_bytes)) if result.state_bytes else None,
        "delta_bytes_per_write_mean": round(statistics.fmean(result.delta_bytes)) if result.delta_bytes else None,
        "delta_bytes_per_write_p99": _p99(result.delta_bytes),
        "heartbeat_delta_bytes_max": max(result.heartbeat_delta_bytes, default=None),
        "heartbeat_only_writes": len(result.heartbeat_delta_bytes),
        "scenarios": args.scenarios,
        "failed_seeds": failed[:20],
    }
    print(json.dumps(figures))
    return figures


def _p99(values: list[int]) -> int | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


if __name__ == "__main__":
    main()
