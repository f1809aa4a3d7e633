"""Asset checks of a stream asset: lag below a bound, and no parked shards or unresolved dead letters.

The member sensors evaluate both: the lag check with each member's lag report (every 30 s, over the shards it
owns), the parked check at a member's first tick and whenever what is parked changes (a range that keeps
failing produces no materialization to attach a result to). A member's run evaluates neither: it carries on
for as long as its shards have records, so its end is a poor clock for either, and each check a run plans is
two more events in the daemon and the run. A backfill or a run launched by hand evaluates both at its end, as
a run of an asset with checks does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster as dg

from dagster_streamgroup.protocol import GroupState

LAG_CHECK = "lag_below_limit"
PARKED_CHECK = "no_parked_ranges"


def check_specs(asset_key: dg.AssetKey) -> list[dg.AssetCheckSpec]:
    """The limit lives on the group resource, which the asset does not know when it is declared."""
    return [
        dg.AssetCheckSpec(
            LAG_CHECK,
            asset=asset_key,
            description="Every shard is at most `lag_alert_records` records and at most `lag_alert_seconds` "
            "seconds behind the stream (fields of the group resource; either or both): evaluated by each member "
            "every 30 s over the shards it owns (and by a backfill over the shards it read); each result's "
            "metadata gives the lag and seconds behind per shard and the limits.",
        ),
        dg.AssetCheckSpec(
            PARKED_CHECK,
            asset=asset_key,
            description="No shard of the group is parked (retries exhausted, offsets lost to retention, or a "
            "committed offset past the stream's end), and no range was dead-lettered (skipped). Unpark with "
            "`streamgroup unpark`.",
        ),
    ]


def _lag_check(
    asset_key: dg.AssetKey,
    lags: Mapping[str, int],
    limit: int | None,
    seconds: Mapping[str, float] | None = None,
    seconds_limit: float | None = None,
) -> dict[str, Any]:
    """The worst of the shards decides, by records, by seconds, or by both (whichever limits are set); each
    shard's lag and seconds behind are in the metadata."""
    seconds = seconds or {}
    over: dict[str, list[str]] = {}
    if limit is not None:
        for shard, lag in sorted(lags.items()):
            if lag > limit:
                over.setdefault(shard, []).append(f"{lag} records behind (limit {limit})")
    if seconds_limit is not None:
        for shard, behind in sorted(seconds.items()):
            if behind > seconds_limit:
                over.setdefault(shard, []).append(f"{behind:.1f} s behind (limit {seconds_limit:g} s)")
    metadata: dict[str, dg.RawMetadataValue] = {
        "max_lag": dg.MetadataValue.int(max(lags.values(), default=-1)),
        "limit": dg.MetadataValue.int(limit) if limit is not None else dg.MetadataValue.null(),
    }
    if seconds or seconds_limit is not None:
        metadata["max_seconds_behind"] = dg.MetadataValue.float(round(max(seconds.values(), default=0.0), 3))
        metadata["limit_seconds"] = (
            dg.MetadataValue.float(float(seconds_limit)) if seconds_limit is not None else dg.MetadataValue.null()
        )
    for shard, lag in sorted(lags.items()):
        metadata[f"lag {shard}"] = dg.MetadataValue.int(lag)
    for shard, behind in sorted(seconds.items()):
        metadata[f"seconds_behind {shard}"] = dg.MetadataValue.float(round(behind, 3))
    text = "; ".join(f"{shard} is {' and '.join(why)}" for shard, why in sorted(over.items()))
    return {
        "asset_key": asset_key,
        "check_name": LAG_CHECK,
        "passed": not over,
        "severity": dg.AssetCheckSeverity.WARN,
        "metadata": metadata,
        "description": text or None,
    }


def lag_check_result(
    asset_key: dg.AssetKey,
    lags: Mapping[str, int],
    limit: int | None,
    seconds: Mapping[str, float] | None = None,
    seconds_limit: float | None = None,
) -> dg.AssetCheckResult:
    """A backfill's or a hand-launched run's result, over the shards it read."""
    return dg.AssetCheckResult(**_lag_check(asset_key, lags, limit, seconds, seconds_limit))


def lag_check_evaluation(
    asset_key: dg.AssetKey,
    lags: Mapping[str, int],
    limit: int | None,
    seconds: Mapping[str, float] | None = None,
    seconds_limit: float | None = None,
) -> dg.AssetCheckEvaluation:
    """A member tick's evaluation, over the shards the member owns."""
    return dg.AssetCheckEvaluation(**_lag_check(asset_key, lags, limit, seconds, seconds_limit))


def _parked_check(asset_key: dg.AssetKey, state: GroupState | None) -> dict[str, Any]:
    """Parked shards and unresolved dead letters fail it; the details list them (the last ten dead letters)."""
    parked = {sid: s.parked for sid, s in state.shards.items() if s.parked is not None} if state is not None else {}
    dead = state.dead_letters if state is not None else []
    metadata: dict[str, dg.RawMetadataValue] = {"parked_shards": dg.MetadataValue.int(len(parked))}
    if state is not None:
        metadata["dead_lettered_ranges"] = dg.MetadataValue.int(len(dead))
    lines = [f"{sid} parked at [{p.start}, {p.end}): {p.reason}" for sid, p in parked.items() if p is not None]
    lines += [f"{d.shard} [{d.start}, {d.end}) dead-lettered: {d.reason}" for d in dead[-10:]]
    if len(dead) > 10:
        lines.append(f"... and {len(dead) - 10} more dead letters (`streamgroup status --group ...` lists them)")
    if lines:
        metadata["details"] = dg.MetadataValue.md("\n".join(f"- {line}" for line in lines))
    return {
        "asset_key": asset_key,
        "check_name": PARKED_CHECK,
        "passed": not parked and not dead,
        "severity": dg.AssetCheckSeverity.ERROR,
        "metadata": metadata,
        "description": "; ".join(lines) or None,
    }


def parked_check_result(asset_key: dg.AssetKey, state: GroupState | None) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(**_parked_check(asset_key, state))


def parked_check_evaluation(asset_key: dg.AssetKey, state: GroupState) -> dg.AssetCheckEvaluation:
    return dg.AssetCheckEvaluation(**_parked_check(asset_key, state))
