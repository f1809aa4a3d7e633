"""Asset checks of a stream asset: lag below a bound, and no parked or dead-lettered ranges.

Both are evaluated by every run (with the state it committed into), and the parked check also by the
member sensors whenever what is parked changes, because a range that keeps failing produces no
materialization to attach a result to.
"""

from __future__ import annotations

import dagster as dg

from dagster_streamgroup.protocol import EventKind, GroupState

LAG_CHECK = "lag_below_limit"
PARKED_CHECK = "no_parked_ranges"


def check_specs(asset_key: dg.AssetKey) -> list[dg.AssetCheckSpec]:
    """The limit lives on the group resource, which the asset does not know when it is declared."""
    return [
        dg.AssetCheckSpec(
            LAG_CHECK,
            asset=asset_key,
            description="The shard this run committed is at most `lag_alert_records` (a field of the group "
            "resource) records behind the stream; each result's metadata gives the lag and the limit.",
        ),
        dg.AssetCheckSpec(
            PARKED_CHECK,
            asset=asset_key,
            description="No shard of the group is parked (retries exhausted, offsets lost to retention, or a "
            "committed offset past the stream's end), and no range was dead-lettered (skipped). Unpark with "
            "`streamgroup unpark`.",
        ),
    ]


def lag_check_result(asset_key: dg.AssetKey, shard: str, lag: int | None, limit: int) -> dg.AssetCheckResult:
    passed = lag is None or lag <= limit
    return dg.AssetCheckResult(
        asset_key=asset_key,
        check_name=LAG_CHECK,
        passed=passed,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "shard": dg.MetadataValue.text(shard),
            "lag": dg.MetadataValue.int(lag if lag is not None else -1),
            "limit": dg.MetadataValue.int(limit),
        },
        description=None if passed else f"{shard} is {lag} records behind (limit {limit})",
    )


def _parked_metadata(state: GroupState | None) -> tuple[bool, dict[str, dg.RawMetadataValue], str]:
    if state is None:
        return True, {"parked_shards": dg.MetadataValue.int(0)}, ""
    parked = {sid: s.parked for sid, s in state.shards.items() if s.parked is not None}
    dead = [e for e in state.events if e.kind == EventKind.DEAD_LETTER]
    metadata: dict[str, dg.RawMetadataValue] = {
        "parked_shards": dg.MetadataValue.int(len(parked)),
        "dead_lettered_ranges": dg.MetadataValue.int(len(dead)),
    }
    lines = [f"{sid} parked at [{p.start}, {p.end}): {p.reason}" for sid, p in parked.items() if p is not None]
    lines += [f"{e.shard} [{e.start}, {e.end}) dead-lettered: {e.detail}" for e in dead[-10:]]
    if lines:
        metadata["details"] = dg.MetadataValue.md("\n".join(f"- {line}" for line in lines))
    return not parked and not dead, metadata, "; ".join(lines)


def parked_check_result(asset_key: dg.AssetKey, state: GroupState | None) -> dg.AssetCheckResult:
    passed, metadata, text = _parked_metadata(state)
    return dg.AssetCheckResult(
        asset_key=asset_key,
        check_name=PARKED_CHECK,
        passed=passed,
        metadata=metadata,
        description=text or None,
    )


def parked_check_evaluation(asset_key: dg.AssetKey, state: GroupState) -> dg.AssetCheckEvaluation:
    passed, metadata, text = _parked_metadata(state)
    return dg.AssetCheckEvaluation(
        asset_key=asset_key,
        check_name=PARKED_CHECK,
        passed=passed,
        metadata=metadata,
        severity=dg.AssetCheckSeverity.ERROR,
        description=text or None,
    )
