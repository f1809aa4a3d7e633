"""What a stream group costs on a managed Dagster that bills steps and materializations, per day.

    python -m bench.dagster_plus_cost [--benchmarks docs/benchmarks.md | --sustained-json FILE]
        [--relaxed-max-wait-s 60] [--relaxed-min-backlog 200000]

Dagster+ bills per step and per materialization. A member run of a stream asset is one step (the asset's op,
its checks included; ``stream_definitions`` and the example use the in-process executor) and records one
materialization per range, that is per shard it read. At the rates below every shard a member owns has records
waiting when it launches, so a run holds ``partitions / members`` ranges. What ``bench.sustained`` measures,
runs per minute at each rate, is therefore the whole bill: ``per_day`` turns it into steps and
materializations per day.

The measured runs per minute are those of the group's defaults (``max_wait_s`` 15 s, ``min_backlog`` 20,000).
For a relaxed setting the member's cycle, from one launch to the next, is modelled (``cycle_s``), not measured:
a member launches once its shards' backlog reaches ``min_backlog`` or the oldest record has waited
``max_wait_s`` since the last commit. The rest of the measured cycle (the run itself, its launch and the ticks'
alignment) is kept as measured; that holds while a run takes less time than the longer wait. Inputs: by
default the runs per minute of the latest ``bench.sustained`` table at its defaults in ``docs/benchmarks.md``
(its rate and runs/min columns, and the 32 partitions and 3 members it states), or the JSON line a
``bench.sustained`` run printed last (``--sustained-json``). The table it prints is the one in
``docs/deploying.md``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

MINUTES_PER_DAY = 24 * 60
DEFAULT_MAX_WAIT_S = 15.0
DEFAULT_MIN_BACKLOG = 20_000
"""The group's defaults (``StreamGroupResource``), which ``bench.sustained``'s example runs with."""
BENCH_PARTITIONS = 32
BENCH_MEMBERS = 3
"""What ``bench.sustained`` runs at its defaults (32 partitions, 3 members), as docs/benchmarks.md states."""
RATES = (1_000.0, 20_000.0)
SUSTAINED_SECTION = "## `bench.sustained` at its defaults"
BENCHMARKS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


@dataclass(frozen=True)
class PerDay:
    """What a day of runs adds up to on a bill of steps and materializations."""

    runs: float
    steps: float
    materializations: float


def per_day(runs_per_minute: float, materializations_per_run: float, steps_per_run: float = 1.0) -> PerDay:
    """Runs, steps and materializations per day at a steady ``runs_per_minute``."""
    if runs_per_minute < 0 or materializations_per_run < 0 or steps_per_run < 0:
        raise ValueError("runs per minute, materializations and steps per run must be >= 0")
    runs = runs_per_minute * MINUTES_PER_DAY
    return PerDay(runs=runs, steps=runs * steps_per_run, materializations=runs * materializations_per_run)


def ranges_per_run(partitions: int, members: int) -> float:
    """Ranges (so materializations) in a member's run when every shard it owns has records waiting."""
    if partitions < 1 or members < 1:
        raise ValueError("partitions and members must be >= 1")
    return partitions / min(members, partitions)


def cycle_s(
    measured_runs_per_minute: float,
    rate: float,
    members: int,
    *,
    max_wait_s: float,
    min_backlog: int,
    measured_max_wait_s: float = DEFAULT_MAX_WAIT_S,
    measured_min_backlog: int = DEFAULT_MIN_BACKLOG,
) -> float:
    """Seconds from one launch of a member to its next under ``max_wait_s`` and ``min_backlog``, from the cycle
    measured under the measured settings.

    A member launches at the earlier of: its backlog (``rate / members`` records a second) reaching
    ``min_backlog``, counted from its last launch; its oldest record having waited ``max_wait_s`` after the run
    before committed (``overhead`` later: the run, its launch and the ticks); and never before that commit. So a
    cycle is ``max(overhead, min(overhead + max_wait_s, min_backlog / member_rate))``, and ``overhead`` is what
    the measured cycle leaves once its own wait is taken out.
    """
    if measured_runs_per_minute <= 0 or rate <= 0 or members < 1:
        raise ValueError("runs per minute, the rate and members must be > 0")
    member_rate = rate / members
    measured = 60.0 * members / measured_runs_per_minute
    reached_in_run = measured_min_backlog / member_rate < measured  # min_backlog waited when the run committed
    overhead = measured if reached_in_run else max(0.0, measured - measured_max_wait_s)
    return max(overhead, min(overhead + max_wait_s, min_backlog / member_rate))


@dataclass(frozen=True)
class Row:
    rate: float
    setting: str
    runs_per_minute: float
    cycle_s: float
    per_day: PerDay
    measured: bool


def table_rows(
    runs_per_minute: dict[float, float],
    partitions: int,
    members: int,
    relaxed: Sequence[tuple[float, int]],
) -> list[Row]:
    """The default row (measured) and one modelled row per relaxed (max_wait_s, min_backlog) at each rate."""
    per_run = ranges_per_run(partitions, members)
    rows = []
    for rate, measured in sorted(runs_per_minute.items()):
        default_cycle = 60.0 * members / measured
        rows.append(
            Row(
                rate,
                _setting(DEFAULT_MAX_WAIT_S, DEFAULT_MIN_BACKLOG),
                measured,
                default_cycle,
                per_day(measured, per_run),
                True,
            )
        )
        for max_wait_s, min_backlog in relaxed:
            cycle = cycle_s(measured, rate, members, max_wait_s=max_wait_s, min_backlog=min_backlog)
            runs = 60.0 * members / cycle
            rows.append(Row(rate, _setting(max_wait_s, min_backlog), runs, cycle, per_day(runs, per_run), False))
    return rows


def _setting(max_wait_s: float, min_backlog: int) -> str:
    return f"`max_wait_s={max_wait_s:g}`, `min_backlog={min_backlog:,}`"


def markdown(rows: Sequence[Row], partitions: int, members: int) -> str:
    per_run = ranges_per_run(partitions, members)
    header = (
        f"| events/s | setting | runs/min | a member's cycle (s) | steps/day | materializations/day ({per_run:.2f}"
        " a run) |"
    )
    lines = [header, "|---|---|---|---|---|---|"]
    for row in rows:
        source = "measured" if row.measured else "modelled"
        lines.append(
            f"| {row.rate:,.0f} | {row.setting} | {row.runs_per_minute:.2f} ({source}) | {row.cycle_s:.1f} | "
            f"{row.per_day.steps:,.0f} | {row.per_day.materializations:,.0f} |"
        )
    return "\n".join(lines)


def runs_per_minute_from_benchmarks(text: str) -> tuple[str, dict[float, float]]:
    """(heading, {rate: runs/min}) of the last ``bench.sustained`` table at its defaults in docs/benchmarks.md."""
    sections = [s for s in re.split(r"(?m)^(?=## )", text) if s.startswith(SUSTAINED_SECTION)]
    if not sections:
        raise ValueError(f"no section {SUSTAINED_SECTION!r}")
    section = sections[-1]
    rows = [line.strip().strip("|").split("|") for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in rows[0]]
    rate_col, runs_col = header.index("rate (events/s)"), header.index("runs/min")
    figures = {}
    for cells in rows[2:]:
        rate = float(cells[rate_col].strip().replace(",", ""))
        figures[rate] = float(cells[runs_col].strip().strip("*"))
    return section.splitlines()[0].removeprefix("## "), figures


def runs_per_minute_from_json(text: str) -> tuple[int, int, dict[float, float]]:
    """(partitions, members, {rate: runs/min}) from the JSON line ``bench.sustained`` prints last."""
    result = json.loads(text.strip().splitlines()[-1])
    rates = {float(p["target_events_per_s"]): float(p["runs_per_minute"]) for p in result["rates"]}
    return int(result["partitions"]), int(result["members"]), rates


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--benchmarks", type=Path, default=BENCHMARKS, help="docs/benchmarks.md (default)")
    parser.add_argument("--sustained-json", type=Path, help="the output of a bench.sustained run instead")
    parser.add_argument("--relaxed-max-wait-s", type=float, default=60.0)
    parser.add_argument("--relaxed-min-backlog", type=int, default=200_000)
    args = parser.parse_args(argv)
    if args.sustained_json is not None:
        partitions, members, measured = runs_per_minute_from_json(args.sustained_json.read_text())
        source = f"{args.sustained_json} ({partitions} partitions, {members} members)"
    else:
        heading, measured = runs_per_minute_from_benchmarks(args.benchmarks.read_text())
        partitions, members = BENCH_PARTITIONS, BENCH_MEMBERS
        source = f"{args.benchmarks}, {heading} ({partitions} partitions, {members} members)"
    measured = {rate: runs for rate, runs in measured.items() if rate in RATES}
    if set(measured) != set(RATES):
        print(f"dagster_plus_cost: the input has no runs/min at {', '.join(f'{r:g}' for r in RATES)}", file=sys.stderr)
        return 1
    relaxed = [(args.relaxed_max_wait_s, DEFAULT_MIN_BACKLOG), (args.relaxed_max_wait_s, args.relaxed_min_backlog)]
    inputs = ", ".join(f"{runs:g} runs/min at {rate:,.0f} events/s" for rate, runs in sorted(measured.items()))
    print(f"measured inputs: {inputs}; from {source}")
    print(markdown(table_rows(measured, partitions, members, relaxed), partitions, members))
    return 0


if __name__ == "__main__":
    sys.exit(main())
