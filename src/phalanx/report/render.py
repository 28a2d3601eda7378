"""Write an experiment run to its out directory: metrics CSV, decision log, plots, index.html."""

from __future__ import annotations

import csv
import html
import re
from collections.abc import Sequence
from pathlib import Path

from phalanx.report import plots
from phalanx.sim.experiment import FgdExperiment, ReplayExperiment

FGD_COLS = [
    "alloc_x50",
    "alloc_x90",
    "alloc_x100",
    "alloc_x130",
    "frag_rate_x50",
    "frag_rate_x90",
    "failed_pods",
]
REPLAY_COLS = [
    "completed",
    "avg_jct_s",
    "median_jct_s",
    "p95_jct_s",
    "avg_wait_s",
    "p95_wait_s",
    "makespan_s",
    "gpu_alloc_pct",
    "deadlocked",
    "starved",
    "restarts",
    "max_wait_large_s",
    "evictions",
    "lost_gpu_h_preempt",
    "jain_index",
]


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "run"


def write_metrics(rows: Sequence[dict[str, object]], path: Path) -> Path:
    cols: list[str] = []
    for r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow(r)
    return path


def render(
    out: Path,
    fgd: Sequence[FgdExperiment],
    replays: Sequence[ReplayExperiment],
    title: str,
    notes: Sequence[str] = (),
) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, object]] = []
    sections: list[str] = []
    for e in fgd:
        rows += e.summary_rows()
        a = plots.fgd_allocation(e, out / f"fgd-alloc-{slug(e.name)}.png")
        f = plots.fgd_fragmentation(e, out / f"fgd-frag-{slug(e.name)}.png")
        ref = e.reference_curves()
        note = (
            f"Dashed: the authors' published curves ({', '.join(sorted(ref))}), mean of their seeds."
            if ref
            else "No published reference curves for this input."
        )
        sections.append(
            _section(
                f"FGD protocol: {e.name}",
                f"{len(e.nodes)} nodes, {len(e.pods)} pods in the list, tune {e.tune}, seeds "
                f"{', '.join(map(str, e.seeds))}. {note}",
                e.summary_rows(),
                FGD_COLS,
                [a.name, f.name],
            )
        )
    for r in replays:
        rows += r.summary_rows()
        imgs = [
            plots.jct_cdf(r, out / f"jct-cdf-{slug(r.name)}.png").name,
            plots.gpu_over_time(r, out / f"gpu-time-{slug(r.name)}.png").name,
            plots.wait_by_queue(r, out / f"wait-queue-{slug(r.name)}.png").name,
            plots.queue_shares(r, out / f"queue-share-{slug(r.name)}.png").name,
        ]
        rt = r.runtime.spec
        factors = ", ".join(
            f"{n} {'on' if getattr(rt, n).enabled else 'off'}" for n in ("spread", "cache", "sharing")
        )
        sections.append(
            _section(
                f"Time replay: {r.name}",
                f"{len(r.jobs)} jobs on {len(r.nodes)} nodes "
                f"({sum(len(n.gpus) for n in r.nodes)} GPUs). Runtime model: {factors}. Jobs without "
                f"checkpoint times checkpoint every {r.checkpoint_interval:g} s; an evicted job loses the "
                "work since its last one. Jain's index: usage / fair share over the queues that want "
                "GPUs, time-averaged while two or more do (1 = fair). Large gangs: 8+ GPUs.",
                r.summary_rows(),
                REPLAY_COLS,
                imgs,
            )
        )
    write_metrics(rows, out / "metrics.csv")
    page = _page(title, sections, notes)
    index = out / "index.html"
    index.write_text(page)
    return index


def _section(
    heading: str, intro: str, rows: list[dict[str, object]], cols: list[str], images: list[str]
) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in ["profile", *cols])
    body = ""
    for r in rows:
        cells = "".join(f"<td>{html.escape(_fmt(r.get(c)))}</td>" for c in ["profile", *cols])
        body += f"<tr>{cells}</tr>"
    imgs = "".join(f'<img src="{html.escape(i)}" alt="{html.escape(i)}">' for i in images)
    return (
        f"<section><h2>{html.escape(heading)}</h2><p>{html.escape(intro)}</p>"
        f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        f'<div class="imgs">{imgs}</div></section>'
    )


def _fmt(v: object) -> str:
    if isinstance(v, float):
        if v != v:  # nan
            return "-"
        return f"{v:,.2f}"
    return "" if v is None else str(v)


def _page(title: str, sections: list[str], notes: Sequence[str]) -> str:
    note_html = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2rem; max-width: 1100px; color: #222; }}
table {{ border-collapse: collapse; margin: 0.5rem 0 1rem; font-size: 0.9rem; }}
th, td {{ border: 1px solid #ccc; padding: 0.25rem 0.6rem; text-align: right; }}
th:first-child, td:first-child {{ text-align: left; }}
.imgs img {{ max-width: 49%; margin: 0.2rem; border: 1px solid #eee; }}
section {{ margin-bottom: 2rem; }}
</style></head><body>
<h1>{html.escape(title)}</h1>
<ul>{note_html}</ul>
{"".join(sections)}
<p>Files: <a href="metrics.csv">metrics.csv</a>, <a href="decisions.jsonl">decisions.jsonl</a>.</p>
</body></html>
"""
