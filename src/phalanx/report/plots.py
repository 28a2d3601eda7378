"""PNG plots of the experiments (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from phalanx.sim.experiment import FgdExperiment, ReplayExperiment, empty_points_quiet
from phalanx.sim.fgd import XS, as_array

X = np.array(list(XS))
X_ARRIVED = "arrived GPU request (% of cluster GPU capacity)"


# per profile, in the experiment's order: line style and marker, so that two profiles whose curves
# coincide (phalanx and fgd do, within the spread over seeds) still show as two lines
STYLES: tuple[tuple[str | tuple[int, tuple[int, int]], str], ...] = (
    ("-", "o"),
    ("--", "s"),
    ("-.", "^"),
    (":", "D"),
    ((0, (5, 1)), "v"),
    ((0, (1, 1)), "x"),
)


def seed_bands(exp: FgdExperiment, which: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per profile at x = 0..130: mean, min and max over the seeds (allocation 0, frag rate 2)."""
    out = {}
    for prof, runs in exp.runs.items():
        arr = (
            np.vstack([as_array(r.discrete()[which]) for r in runs])
            if runs
            else np.full((1, len(XS)), np.nan)
        )
        with empty_points_quiet():
            out[prof] = (np.nanmean(arr, axis=0), np.nanmin(arr, axis=0), np.nanmax(arr, axis=0))
    return out


def _banded(ax: Axes, exp: FgdExperiment, which: int, legend: bool = True) -> None:
    """Mean lines with min-max bands; the first profile (the one under test) drawn on top."""
    bands = seed_bands(exp, which)
    for k, (prof, (mean, lo, hi)) in reversed(list(enumerate(bands.items()))):
        ls, marker = STYLES[k % len(STYLES)]
        ax.fill_between(X, lo, hi, color=f"C{k}", alpha=0.18, lw=0, zorder=2 + k)
        ax.plot(
            X,
            mean,
            color=f"C{k}",
            ls=ls,
            marker=marker,
            markevery=(2 * k, 10),
            ms=4,
            lw=1.6,
            label=f"{prof} (ours)" if legend else None,
            zorder=10 - k,
        )


def _legend(ax: Axes, ours: int, fontsize: float, upper_left: bool = False) -> None:
    """The legend in the experiment's profile order (`_banded` draws them last to first)."""
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(
        handles[:ours][::-1] + handles[ours:],
        labels[:ours][::-1] + labels[ours:],
        fontsize=fontsize,
        loc="upper left" if upper_left else "best",
    )


def fgd_allocation(exp: FgdExperiment, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    _banded(ax, exp, 0)
    for label, y in sorted(exp.reference_curves().items()):
        ax.plot(X, y, ls="--", lw=1.0, label=f"{label} (authors)")
    ax.plot(X, np.minimum(X, 100), color="grey", lw=0.6, ls=":", label="arrived (ideal)")
    ax.set_xlabel(X_ARRIVED)
    ax.set_ylabel("GPU allocation (%)")
    n = len(exp.seeds)
    ax.set_title(f"FGD protocol: {exp.name} (mean; band: min-max over {n} seed{'s' * (n != 1)})", fontsize=10)
    at90 = [float(y[90]) for y in exp.curves(0).values() if y[90] == y[90]]  # none past --tune x 100 %
    lo = min(80.0, min(at90, default=82.0) - 2)
    ax.set_xlim(0, 130)
    ax.set_ylim(0, 101)
    ax.grid(alpha=0.3)
    _legend(ax, len(exp.runs), fontsize=7, upper_left=True)
    inset = ax.inset_axes((0.55, 0.08, 0.42, 0.45))
    _banded(inset, exp, 0, legend=False)
    for _, y in sorted(exp.reference_curves().items()):
        inset.plot(X, y, ls="--", lw=0.8)
    inset.set_xlim(85, 130)
    inset.set_ylim(lo, 100)
    inset.grid(alpha=0.3)
    inset.tick_params(labelsize=6)
    return _save(fig, path)


def fgd_fragmentation(exp: FgdExperiment, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    _banded(ax, exp, 2)
    ax.set_xlabel(X_ARRIVED)
    ax.set_ylabel("fragmentation rate of idle GPU (%)")
    ax.set_title(f"Fragmentation (FGD's definition): {exp.name} (band: min-max over seeds)", fontsize=10)
    ax.grid(alpha=0.3)
    _legend(ax, len(exp.runs), fontsize=8)
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
    """One panel per profile (a shared axis), each with its time average: step lines do not tangle."""
    profs = list(exp.results)
    fig, axes = plt.subplots(
        max(len(profs), 1),
        1,
        figsize=(7, 1.3 * max(len(profs), 1) + 1.0),
        sharex=True,
        sharey=True,
        squeeze=False,
    )
    for k, (ax, prof) in enumerate(zip(axes[:, 0], profs, strict=False)):
        res = exp.results[prof]
        t = np.array([s.time for s in res.samples]) / 3600
        a = np.array([100 * s.gpu_alloc for s in res.samples])
        if len(t):
            ax.fill_between(t, a, step="post", color=f"C{k}", alpha=0.35, lw=0)
            ax.step(t, a, where="post", color=f"C{k}", lw=0.8)
            avg = 100 * res.time_avg_alloc()
            ax.axhline(avg, color="black", lw=0.8, ls="--")
            ax.text(
                0.99,
                0.9,
                f"{prof}: time average {avg:.1f} %",
                transform=ax.transAxes,
                ha="right",
                va="top",
                fontsize=8,
                bbox={"facecolor": "white", "alpha": 0.8, "lw": 0},
            )
        ax.set_ylim(0, 105)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    axes[len(axes) // 2, 0].set_ylabel("GPUs allocated (%)")
    axes[-1, 0].set_xlabel("time (h)")
    fig.suptitle(f"GPU allocation over time: {exp.name}", fontsize=10)
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
