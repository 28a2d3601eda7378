"""A sweep's points on a Dask cluster (`phalanx sweep --dask`): see `phalanx.sim.sweep` for why Dask.

The inputs (every cluster variant with its jobs, every profile) are scattered to each worker once;
each point is one task that sends back its replay's summary, taken as it completes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from phalanx.core.errors import SpecError
from phalanx.core.profile import Profile
from phalanx.sim.sweep import Knobs, Point, Row, Variant, run_point

# a local cluster's workers: no statistical profiler, no GIL sampling (a replay is all CPU)
QUIET_WORKERS = {
    "distributed.worker.profile.enabled": False,
    "distributed.admin.system-monitor.gil.enabled": False,
}


def _point(variants: dict[str, Variant], profiles: dict[str, Profile], p: Point, knobs: Knobs) -> Row:
    return run_point(variants[p.variant], profiles[p.profile], p, knobs)


def on_dask(
    address: str,
    workers: int,
    todo: list[Point],
    variants: dict[str, Variant],
    profiles: dict[str, Profile],
    knobs: Knobs,
    timeout_s: float = 20.0,
) -> Iterator[tuple[Point, Row]]:
    """The points on a Dask cluster: the inputs scattered to every worker once, one task a point."""
    try:
        import dask
        from distributed import Client, LocalCluster
        from distributed import as_completed as dask_completed
    except ImportError:
        raise SpecError(
            "--dask", "needs Dask's distributed scheduler: pip install 'phalanx[sweep]'"
        ) from None
    cluster = None
    if address == "local":
        n = workers or os.cpu_count() or 1
        # the workers' own sampling profiler (every 10 ms) takes the GIL from the replays: off
        with dask.config.set(QUIET_WORKERS):
            cluster = LocalCluster(
                n_workers=n, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
            )
        client = Client(cluster)
    else:
        try:
            client = Client(address, timeout=f"{timeout_s}s")
        except OSError as e:
            raise SpecError("--dask", f"cannot reach the Dask scheduler at {address}: {e}") from None
    try:
        inputs = client.scatter([variants, profiles], broadcast=True)
        futures = {client.submit(_point, inputs[0], inputs[1], p, knobs, pure=False): p for p in todo}
        for f in dask_completed(futures):
            yield futures[f], f.result()
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


__all__ = ["on_dask"]
