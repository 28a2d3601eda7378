"""PNG plots of the experiments (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from phalanx.sim.experiment import FgdExperiment, ReplayExperiment
from phalanx.sim.fgd import XS

X = np.array(list(XS))
X_ARRIVED = "arrived GPU request (% of cluster GPU capacity)"


def fgd_allocation(exp: FgdExperiment, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for prof, y in exp.curves(0).items():
        ax.plot(X, y, label=f"{prof} (ours)", lw=1.8)
    for label, y in sorted(exp.reference_curves().items()):
        ax.plot(X, y, ls="--", lw=1.0, label=f"{label} (authors)")
    ax.plot(X, np.minimum(X, 100), color="grey", lw=0.6, ls=":", label="arrived (ideal)")
    ax.set_xlabel(X_ARRIVED)
    ax.set_ylabel("GPU allocation (%)")
    ax.set_title(f"FGD protocol: {exp.name}")
    lo = min(80.0, float(np.nanmin([y[90] for y in exp.curves(0).values()] or [80.0])) - 2)
    ax.set_xlim(0, 130)
    ax.set_ylim(0, 101)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    inset = ax.inset_axes((0.55, 0.08, 0.42, 0.4))
    for y in exp.curves(0).values():
        inset.plot(X, y, lw=1.5)
    for _, y in sorted(exp.reference_curves().items()):
        inset.plot(X, y, ls="--", lw=0.8)
    inset.set_xlim(85, 130)
    inset.set_ylim(lo, 100)
    inset.grid(alpha=0.3)
    inset.tick_params(labelsize=6)
    return _save(fig, path)


def fgd_fragmentation(exp: FgdExperiment, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for prof, y in exp.curves(2).items():
        ax.plot(X, y, label=prof)
    _label(
        ax, X_ARRIVED, "fragmentation rate of idle GPU (%)", f"Fragmentation (FGD's definition): {exp.name}"
    )
    return _save(fig, path)


def jct_cdf(exp: ReplayExperiment, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for prof, res in exp.results.items():
        jct = np.sort([j.jct for j in res.jobs if j.jct is not None])
        if len(jct):
            ax.step(jct, np.arange(1, len(jct) + 1) / len(res.jobs), where="post", label=prof)
    ax.set_xscale("log")
    _label(ax, "job completion time (s)", "fraction of jobs", f"JCT CDF: {exp.name}")
    return _save(fig, path)


def gpu_over_time(exp: ReplayExperiment, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for prof, res in exp.results.items():
        t = np.array([s.time for s in res.samples])
        a = np.array([100 * s.gpu_alloc for s in res.samples])
        if len(t):
            ax.step(t / 3600, a, where="post", label=prof, lw=1.0)
    _label(ax, "time (h)", "GPUs allocated (%)", f"GPU allocation over time: {exp.name}")
    return _save(fig, path)


def wait_by_queue(exp: ReplayExperiment, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    profiles = list(exp.results)
    queues = sorted({j.spec.queue for res in exp.results.values() for j in res.jobs})
    width = 0.8 / max(len(profiles), 1)
    for k, prof in enumerate(profiles):
        res = exp.results[prof]
        means = []
        for q in queues:
            w = [j.wait for j in res.jobs if j.spec.queue == q and j.wait is not None]
            means.append(float(np.mean(w)) if w else 0.0)
        ax.bar(np.arange(len(queues)) + k * width, means, width, label=prof)
    ax.set_xticks(np.arange(len(queues)) + 0.4 - width / 2)
    ax.set_xticklabels(queues, rotation=45, ha="right", fontsize=7)
    ax.set_ylabel("mean queueing delay (s)")
    ax.set_title(f"Queueing delay by queue: {exp.name}")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    return _save(fig, path)


def queue_shares(exp: ReplayExperiment, path: Path, most: int = 6) -> Path:
    """Per profile: each busy queue's GPUs in use (solid) against its fair share (dashed)."""
    profiles = [p for p, r in exp.results.items() if r.shares is not None and r.shares.times]
    fig, axes = plt.subplots(
        max(len(profiles), 1), 1, figsize=(7, 2.2 * max(len(profiles), 1) + 0.6), sharex=True, squeeze=False
    )
    for ax, prof in zip(axes[:, 0], profiles, strict=False):
        sh = exp.results[prof].shares
        assert sh is not None
        t = np.array(sh.times) / 3600
        use, fair = np.vstack(sh.use), np.vstack(sh.fair)
        dt = np.append(np.diff(sh.times), 0.0)
        busiest = np.argsort(-(use * dt[:, None]).sum(axis=0))[:most]
        for k, q in enumerate(busiest):
            color = f"C{k}"
            ax.step(t, use[:, q], where="post", lw=1.0, color=color, label=sh.leaves[q])
            ax.step(t, fair[:, q], where="post", lw=0.8, ls="--", color=color)
        ax.set_ylabel("GPUs")
        j = sh.mean_index()
        ax.set_title(
            f"{prof}: Jain {j:.2f}" if j == j else f"{prof} (one queue wanted GPUs at a time)", fontsize=9
        )
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=3)
    axes[-1, 0].set_xlabel("time (h)")
    fig.suptitle(f"Queue GPU use (solid) vs fair share (dashed): {exp.name}", fontsize=10)
    return _save(fig, path)


def _label(ax: Axes, xlabel: str, ylabel: str, title: str) -> None:
    """The axis labels, title, grid and legend every line plot here shares."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
