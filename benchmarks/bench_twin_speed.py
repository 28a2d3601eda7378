"""One Gavel tenancy replay of the default profile: its wall and CPU time, and a digest of its decisions.

    python benchmarks/bench_twin_speed.py [--first 2500] [--profile phalanx-queues] [--load 1]
    PYTHONPATH=OTHER_TREE/src python benchmarks/bench_twin_speed.py ...   # the same on another tree

Speed work must not change a decision (issue 36): the digest is of every bind and eviction the
replay logs (time, task, node, devices), and "all" adds every pending reason and hold; two trees
that decide alike print the same two digests. The input is `bench_sim.py tenancy`'s (the Gavel msr
seed 0 trace on 500 V100, a queue per virtual cluster at an equal share); `--first 0` replays the
whole trace (about an hour and a half of one core). Needs ../shared/traces.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import time

from bench_sim import tenancy_input
from phalanx.core.queues import Queue, QueueTree, ResourceQuota
from phalanx.profiles import load_profile
from phalanx.sim.replay import replay


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--first", type=int, default=2500, help="the first N jobs by submit time (0: all)")
    ap.add_argument("--profile", default="phalanx-queues")
    ap.add_argument("--load", type=float, default=1.0)
    args = ap.parse_args()
    ((_, jobs, nodes, levels),) = tenancy_input("gavel", args.first, args.load)
    vcs = sorted({j.queue for j in jobs})
    share = len(nodes[0].gpus) * len(nodes) * 1000 / len(vcs)
    tree = QueueTree(Queue(v, quotas={"gpu": ResourceQuota(share)}) for v in vcs)
    log = io.StringIO()
    t0, c0 = time.perf_counter(), time.process_time()
    prof = load_profile(args.profile)
    s = replay(nodes, jobs, prof, topology_levels=levels, queues=tree, log=log).summary()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    text = log.getvalue()
    acts = "\n".join(line for line in text.splitlines() if json.loads(line)["kind"] != "pending")
    print(
        f"{len(jobs):,} jobs, {args.profile}, load {args.load:g}: wall {wall:.1f} s, CPU {cpu:.1f} s, "
        f"{s['cycles']:,} cycles, {s['evictions']:,} evictions, avg JCT {float(s['avg_jct_s']):,.0f} s; "
        f"decisions {hashlib.md5(acts.encode()).hexdigest()}, all {hashlib.md5(text.encode()).hexdigest()}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
