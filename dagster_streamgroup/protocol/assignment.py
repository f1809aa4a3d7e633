"""Fair assignment of shards to live members.

Every member, on every tick, may move shards between members: free shards go to members under their
quota, and *idle* shards (no range in flight) of members above their quota are moved too. A shard with a
range in flight is never moved; it moves after its run reports, at a safe point (Pravega releases only after
a checkpoint for the same reason). Because any member can rebalance the whole group in one CAS write, a cold
start or a failover converges in one write instead of one shard per member per tick.

Quotas: N assignable shards over R live members, ``N // R`` each, and the ``N % R`` extra shards go to the
members that already own the most (ties by id), which keeps movement minimal and the result deterministic.
A member assigns only after its join grace, so members that start together all register first and the
first one does not take everything (the greedy first reader of Pravega / Flink connectors #15).

A member is handed only shards of the parts of the stream it consumes (``Member.scope``), and gives up, at a safe
point, an owned shard of a part it no longer lists; shards of a part nobody lists (``removed``) are not assigned.
While deployments disagree about the list (a rolling change) the quotas count every member alike, so the balance
is approximate until they agree; no shard is ever handed to a member that would not read it.
"""

from __future__ import annotations

from dagster_streamgroup.protocol.lifecycle import in_scope
from dagster_streamgroup.protocol.policy import GroupPolicy
from dagster_streamgroup.protocol.state import GroupState, ShardState, handed_over


def is_draining(state: GroupState, shard: ShardState) -> bool:
    """Owned by a departed member whose run is still in flight."""
    return shard.owner is not None and shard.owner not in state.members and shard.inflight is not None


def is_assignable(state: GroupState, shard: ShardState) -> bool:
    return not is_draining(state, shard) and not shard.removed


def quotas(state: GroupState) -> dict[str, int]:
    """How many assignable shards each live member should own."""
    owned, free = _ownership(state)
    idle = {mid: sum(state.shards[s].inflight is None for s in shard_ids) for mid, shard_ids in owned.items()}
    counts = {mid: len(shard_ids) for mid, shard_ids in owned.items()}
    return _quotas(counts, len(free) + sum(counts.values()), idle)


def _ownership(state: GroupState) -> tuple[dict[str, list[str]], list[str]]:
    """Assignable shards per live member, and the assignable shards nobody live owns, or whose owner no longer
    consumes their part and has nothing in flight on them (one pass)."""
    members = state.members
    scopes = {mid: m.scope for mid, m in members.items() if m.scope is not None}
    owned: dict[str, list[str]] = {mid: [] for mid in members}
    free: list[str] = []
    for shard_id, shard in state.shards.items():
        if shard.removed:
            continue
        owner = shard.owner
        if owner in owned:
            if owner in scopes and shard.inflight is None and not in_scope(scopes[owner], shard_id):
                free.append(shard_id)
            else:
                owned[owner].append(shard_id)
        elif owner is None or shard.inflight is None:
            free.append(shard_id)
    return owned, free


def _quotas(counts: dict[str, int], total: int, idle: dict[str, int] | None = None) -> dict[str, int]:
    """``base`` shards each and one more for ``extra`` members: those that hold the most, and among equals those
    with no idle shard first. A member whose shards are all in flight cannot give one up now, so the one asked
    to is one that can: otherwise a member with a long run could hold the surplus while a member under quota
    waits for it, and the group never balances while the others keep launching."""
    if not counts:
        return {}
    base, extra = divmod(total, len(counts))
    movable = idle or {}
    ranked = sorted(counts, key=lambda mid: (-counts[mid], movable.get(mid, 0) > 0, mid))
    return {mid: base + (1 if rank < extra else 0) for rank, mid in enumerate(ranked)}


def rebalance(state: GroupState, member_id: str, now: float, policy: GroupPolicy) -> GroupState:
    """Move free and surplus idle shards to members under quota. A no-op returns ``state`` itself."""
    me = state.members.get(member_id)
    if me is None or now - me.joined < policy.grace_s:
        return state
    owned, pool = _ownership(state)
    idle = {mid: sum(state.shards[s].inflight is None for s in shard_ids) for mid, shard_ids in owned.items()}
    quota = _quotas(
        {mid: len(shard_ids) for mid, shard_ids in owned.items()}, len(pool) + sum(map(len, owned.values())), idle
    )
    for mid, shard_ids in owned.items():
        surplus = len(shard_ids) - quota[mid]
        if surplus <= 0:
            continue
        for shard_id in reversed(shard_ids):
            if surplus == 0:
                break
            if state.shards[shard_id].inflight is None:
                pool.append(shard_id)
                surplus -= 1
    if not pool:
        return state
    deficits = sorted(
        ((quota[mid] - len(shard_ids), mid) for mid, shard_ids in owned.items() if len(shard_ids) < quota[mid]),
        key=lambda item: (-item[0], item[1]),
    )
    if not deficits:
        return _normalise_free(state, pool)
    shards = dict(state.shards)
    position = {shard_id: i for i, shard_id in enumerate(state.shards)}
    pool.sort(key=position.__getitem__)
    if any(state.members[mid].scope is not None for _deficit, mid in deficits):
        left = _hand_out_in_scope(state, shards, pool, deficits)
    else:
        cursor = 0
        for deficit, mid in deficits:
            for shard_id in pool[cursor : cursor + deficit]:
                shard = shards[shard_id]
                shards[shard_id] = handed_over(shard, mid, backlog_since=None)
            cursor += deficit
            if cursor >= len(pool):
                break
        left = pool[cursor:]
    for shard_id in left:
        shard = shards[shard_id]
        if shard.owner is not None:
            shards[shard_id] = handed_over(shard, None, backlog_since=None)
    return state.model_copy(update={"shards": shards})


def _hand_out_in_scope(
    state: GroupState, shards: dict[str, ShardState], pool: list[str], deficits: list[tuple[int, str]]
) -> list[str]:
    """The pool handed to the members under quota, each taking only shards of the parts it consumes. What none of
    them can take stays with its owner where that owner consumes its part, or goes to the member with the fewest
    shards that does: while members disagree about the parts, every shard some member consumes keeps being read
    (a quota met at the price of a shard nobody reads would be no balance). Returns what no member consumes."""
    counts: dict[str, int] = dict.fromkeys(state.members, 0)
    for shard_id, shard in state.shards.items():
        if shard.owner in counts and shard_id not in pool:
            counts[shard.owner] += 1
    left = list(pool)
    for deficit, mid in deficits:
        scope = state.members[mid].scope
        taken = [s for s in left if in_scope(scope, s)][:deficit]
        for shard_id in taken:
            shard = shards[shard_id]
            if shard.owner != mid:
                shards[shard_id] = handed_over(shard, mid, backlog_since=None)
            counts[mid] += 1
        gone = set(taken)
        left = [s for s in left if s not in gone]
    nobody: list[str] = []
    for shard_id in left:
        shard = shards[shard_id]
        owner = shard.owner
        if owner in state.members and in_scope(state.members[owner].scope, shard_id):
            counts[owner] += 1
            continue
        takers = [mid for mid, m in state.members.items() if in_scope(m.scope, shard_id)]
        if not takers:
            nobody.append(shard_id)
            continue
        taker = min(takers, key=lambda mid: (counts[mid], mid))
        shards[shard_id] = handed_over(shard, taker, backlog_since=None)
        counts[taker] += 1
    return nobody


def _normalise_free(state: GroupState, pool: list[str]) -> GroupState:
    """Shards left by departed members with nothing in flight, or owned by a member that no longer consumes their
    part: owner cleared (epoch bumped) once."""
    stale = [
        s
        for s in pool
        if (owner := state.shards[s].owner) is not None
        and (owner not in state.members or not in_scope(state.members[owner].scope, s))
    ]
    if not stale:
        return state
    shards = dict(state.shards)
    for shard_id in stale:
        shard = shards[shard_id]
        shards[shard_id] = handed_over(shard, None)
    return state.model_copy(update={"shards": shards})
