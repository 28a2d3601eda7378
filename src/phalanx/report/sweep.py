"""A sweep's report: every point's figures, their spread over the seeds, plots with bands, one page.

Files in the out directory: `sweep.csv` (one row a replay), `summary.csv` (per cluster, profile
and load: the mean over seeds, min, max and the 95 % interval of the mean of each figure),
`sweep-<cluster>.png` (average JCT and GPUs allocated against load, one line a profile, the
band min-max over seeds) and `index.html`.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from phalanx.report.headline import Spread
from phalanx.report.render import slug, write_metrics
from phalanx.sim.sweep import Row
from phalanx.web import asset

# figure -> (label, unit): what the summary and the page show of each replay
FIGURES = {
    "avg_jct_s": ("average JCT", "s"),
    "p95_jct_s": ("95th percentile JCT", "s"),
    "avg_wait_s": ("average wait", "s"),
    "gpu_alloc_pct": ("GPUs allocated", "%"),
    "jain_index": ("Jain's fairness index", ""),
    "evictions": ("evictions", ""),
    "lost_gpu_h_preempt": ("GPU-hours lost to preemption", "GPU-h"),
    "lost_gpu_h_restart": ("GPU-hours restarting evicted runs", "GPU-h"),
}
KEY = ("cluster", "profile", "load")


def summarize(rows: Sequence[Row]) -> list[Row]:
    """Per cluster, profile and load: each figure's mean over seeds, min, max, 95 % half-width."""
    groups: dict[tuple[object, ...], list[Row]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in KEY), []).append(r)
    out = []
    for key, rs in groups.items():
        row: Row = dict(zip(KEY, key, strict=True)) | {"seeds": len(rs)}
        for fig in FIGURES:
            sp = Spread.of([float(r[fig]) for r in rs if r.get(fig) is not None])
            row |= {fig: sp.mean, f"{fig}_min": sp.lo, f"{fig}_max": sp.hi, f"{fig}_ci95": sp.half}
        out.append(row)
    return out


def plot(summary: Sequence[Row], cluster: str, path: Path) -> Path:
    """Average JCT and GPUs allocated against load for one cluster: a line a profile, a band over seeds."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    mine = [r for r in summary if r["cluster"] == cluster]
    for k, prof in enumerate(dict.fromkeys(str(r["profile"]) for r in mine)):
        rs = sorted((r for r in mine if r["profile"] == prof), key=lambda r: float(r["load"]))
        x = [float(r["load"]) for r in rs]
        for ax, fig_key in zip(axes, ("avg_jct_s", "gpu_alloc_pct"), strict=True):
            ax.plot(x, [r[fig_key] for r in rs], marker="o", lw=1.2, color=f"C{k}", label=prof)
            lo = [r[f"{fig_key}_min"] for r in rs]
            hi = [r[f"{fig_key}_max"] for r in rs]
            ax.fill_between(x, lo, hi, color=f"C{k}", alpha=0.18, lw=0)
    for ax, fig_key in zip(axes, ("avg_jct_s", "gpu_alloc_pct"), strict=True):
        label, unit = FIGURES[fig_key]
        ax.set_xlabel("load (arrival rate x the trace's)")
        ax.set_ylabel(f"{label} ({unit})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{cluster}: mean over seeds, band min-max", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def render(out: Path, rows: Sequence[Row], title: str, notes: Sequence[str]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    write_metrics(list(rows), out / "sweep.csv")
    summary = summarize(rows)
    write_metrics(summary, out / "summary.csv")
    (out / "style.css").write_bytes(asset("style.css"))
    sections = []
    for cluster in dict.fromkeys(str(r["cluster"]) for r in summary):
        img = plot(summary, cluster, out / f"sweep-{slug(cluster)}.png")
        table = _table([r for r in summary if r["cluster"] == cluster])
        sections.append(
            f"<section><h2>{html.escape(cluster)}</h2>{table}"
            f'<div class="grid"><figure><img src="{img.name}" alt="JCT and GPUs allocated against load">'
            f"<figcaption>Mean over seeds; the band spans the lowest to the highest seed.</figcaption>"
            f"</figure></div></section>"
        )
    items = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title><link rel="stylesheet" href="style.css"><link rel="icon" href="data:,">
</head><body><header><h1>{html.escape(title)}</h1></header><main>
<section><h2>Inputs</h2><ul>{items}</ul><p class="note">Files: <a href="sweep.csv">sweep.csv</a> (every
replay), <a href="summary.csv">summary.csv</a> (mean, min, max and 95 % interval over seeds).</p></section>
{"".join(sections)}</main></body></html>
"""
    index = out / "index.html"
    index.write_text(page)
    return index


def _table(rows: Sequence[Row]) -> str:
    shown = ("avg_jct_s", "p95_jct_s", "avg_wait_s", "gpu_alloc_pct", "jain_index", "evictions")
    head = '<th>profile</th><th class="num">load</th><th class="num">seeds</th>' + "".join(
        f'<th class="num">{html.escape(FIGURES[f][0])}{f" ({FIGURES[f][1]})" if FIGURES[f][1] else ""}</th>'
        for f in shown
    )
    body = ""
    for r in sorted(rows, key=lambda r: (str(r["profile"]), float(r["load"]))):
        cells = "".join(f'<td class="num">{html.escape(_cell(r, f))}</td>' for f in shown)
        body += (
            f'<tr><td class="name">{html.escape(str(r["profile"]))}</td><td class="num">{r["load"]:g}</td>'
            f'<td class="num">{r["seeds"]}</td>{cells}</tr>'
        )
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _cell(r: Row, fig: str) -> str:
    """The mean, and ± the 95 % half-width where there are two seeds or more."""
    v = r[fig]
    if v != v:
        return "n/a"
    digits = 3 if fig == "jain_index" else 1 if abs(v) < 100 else 0
    half = r[f"{fig}_ci95"]
    return f"{v:,.{digits}f}" + (f" ± {half:,.{digits}f}" if half == half else "")


__all__ = ["FIGURES", "plot", "render", "summarize"]
