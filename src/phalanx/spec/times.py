"""Times as Kubernetes objects, annotations and traces write them (RFC 3339), read one way.

Every room that reads a time from outside imports this: the adapter's read side (pods, PodGroups,
checkpoint annotations), its leader election (the Lease's renewTime) and the simulator's trace
loaders. It sits in `spec`, the lowest room all of them may import that may use `datetime` (the
core may not: it knows no wall clock).
"""

from __future__ import annotations

from datetime import datetime


def rfc3339(text: str, *, offset_required: bool = False) -> float | None:
    """`2026-12-01T10:00:00Z` (or `+02:00`, fractions of a second) -> epoch seconds; None when the
    text is not such a time. A time without an offset is read as local time, as `datetime` reads
    it, unless `offset_required` (then None: a user-written time is ambiguous without one)."""
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
        if offset_required and t.tzinfo is None:
            return None
        return t.timestamp()
    except ValueError:
        return None
