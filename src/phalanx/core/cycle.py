"""The one entry point both drivers call: snapshot in, decisions out."""

from __future__ import annotations

import numpy as np

from phalanx.core.decisions import CycleResult
from phalanx.core.profile import Profile
from phalanx.core.session import Session, Stream
from phalanx.core.snapshot import Snapshot
from phalanx.core.wake import next_wake


def run_cycle(
    snapshot: Snapshot,
    profile: Profile,
    clock: float,
    rng: np.random.Generator,
    apply: bool = False,
    stream: Stream | None = None,
) -> CycleResult:
    """Run one scheduling cycle.

    1. Open a session over the snapshot with the profile's plugins, the clock and the rng.
    2. Run the profile's actions in order (allocate, backfill, ...); each works through
       statements, so a gang is placed whole or not at all.
    3. Collect the committed operations as Bind / Evict decisions and the Pending reasons.
    4. Undo everything, leaving `snapshot` as it was: the driver applies the decisions. With
       `apply`, keep them instead: the snapshot ends as `snapshot.apply(result, clock)` would
       leave it, without undoing and redoing every placement (a tenth of a cycle).
    5. Say when the clock alone may change the answer (`result.wake`, `phalanx.core.wake`): the
       driver need not cycle before then unless the snapshot changes.

    With `stream`, each workload allocate places whole is also handed out as soon as it is placed
    (its binds are final: nothing later in the cycle evicts or moves it), so a driver can bind the
    first gangs of a burst while the rest are decided; the result still holds every bind.

    Deterministic: same snapshot, profile, clock and rng state give the same result.

    MIG GPUs whose repartition (an earlier cycle's decision) is due serve their new layout first.
    """
    if snapshot.recuts:
        snapshot.finish_recuts(clock)
    session = Session(snapshot, profile, clock, rng, stream)
    try:
        for action in profile.actions:
            action.execute(session)
        result = session.result()
    except BaseException:
        session.close()
        raise
    if apply:
        session.keep()
        snapshot.begin_recuts(result, clock)
        snapshot.settle(result)
        snapshot.note_evictions(result, clock)
    else:
        session.close()
    result.wake = next_wake(session, result)
    return result
