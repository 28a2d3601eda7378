"""A pending group's first workloads in profile order, kept across cycles.

The free-capacity gate tries only the first k + 1 of a group of alike workloads
(`Session.gated_pending`); with a profile order other than the natural one it picked them with
`heapq.nsmallest` over the whole group every cycle, working out every waiting workload's key
again. A waiting workload's key holds while it waits: priority and age are fixed, and its
attained service moves only while it runs. So the group's order is kept, with the entry and the
attained service each key was made from, and each cycle only arrivals, leavers and members whose
entry or attained service changed are keyed anew. Orders whose key depends on more (run time,
the cycle) take `nsmallest` as before.
"""

from __future__ import annotations

import bisect
import heapq
from typing import TYPE_CHECKING

from phalanx.core.snapshot import WorkloadEntry

if TYPE_CHECKING:
    from phalanx.core.session import Session

Key = tuple[object, ...]


class KeptOrder:
    """One group's members by key: name -> (entry, attained service, key), and (key, name) sorted."""

    __slots__ = ("members", "order", "profile")

    def __init__(self, profile: object) -> None:
        self.profile = profile
        self.members: dict[str, tuple[WorkloadEntry, float, Key]] = {}
        self.order: list[tuple[Key, str]] = []


def first_in_order(
    session: Session, key: tuple[object, ...], group: dict[str, WorkloadEntry], n: int
) -> list[WorkloadEntry]:
    """`heapq.nsmallest(n, group.values(), key=session.order_key)`: the same workloads, in order
    (keys end with the name, so no two tie)."""
    how = session.order_mode()
    if how not in ("entry", "attained"):
        return heapq.nsmallest(n, group.values(), key=session.order_key)
    store = session.snapshot.kept_orders
    kept = store.get(key)
    if not isinstance(kept, KeptOrder) or kept.profile is not session.profile:
        kept = KeptOrder(session.profile)
        store[key] = kept
        if len(store) > 2 * len(session.snapshot.pending_groups) + 64:  # groups gone since
            for gone in [k for k in store if k not in session.snapshot.pending_groups]:
                del store[gone]
            store[key] = kept
    members, order = kept.members, kept.order
    by_attained = how == "attained"
    # a member not running has attained what its base says (read as a field, not the property)
    stale = [
        name
        for name, had in members.items()
        if (e := group.get(name)) is not had[0]
        or (by_attained and (e.run_since is not None or had[1] != e.attained_base))
    ]
    for name in stale:
        del order[bisect.bisect_left(order, (members.pop(name)[2], name))]
    if len(members) < len(group):
        fresh = [(session.order_key(e), name, e) for name, e in group.items() if name not in members]
        for k, name, e in fresh:
            members[name] = (e, e.attained, k)
        if len(fresh) > 8:
            order.extend((k, name) for k, name, _ in fresh)
            order.sort()
        else:
            for k, name, _ in fresh:
                bisect.insort(order, (k, name))
    return [members[name][0] for _, name in order[:n]]
