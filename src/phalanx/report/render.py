"""Write an experiment run to its out directory: metrics CSV, decision log, plots, index.html.

The page opens with one paragraph that says what was compared and what won, a win only where
it exceeds the spread over the seeds, a tie called a tie (`phalanx.report.headline`); tables have
human column names with units, few enough columns each to fit a 1,280 px window (and scroll inside
their box, not off the page, where narrower), say why a value is missing instead of printing
`nan`, and show counts without decimals; plots sit on a grid, with few lines per axes (bands for
the spread over seeds, one panel per profile for step lines). It shares its style sheet with the
live dashboard (`phalanx.web`).
"""

from __future__ import annotations

import csv
import html
import re
from collections.abc import Sequence
from pathlib import Path

from phalanx.report import plots
from phalanx.report.headline import (
    Spread,
    fgd_headline,
    lead_cells,
    per_seed,
    replay_headline,
    split_sentence,
)
from phalanx.sim.experiment import FgdExperiment, ReplayExperiment
from phalanx.web import asset

# column -> (label, kind): kind says how to show it (pct, s, count, gpuh, ratio)
FGD_COLS = {
    "alloc_x50": ("GPUs allocated, 50 % load", "pct"),
    "alloc_x90": ("GPUs allocated, 90 % load", "pct"),
    "alloc_x100": ("GPUs allocated, 100 % load", "pct"),
    "alloc_x100_spread": ("100 % load: min-max over seeds; 95 % interval of the mean", "text"),
    "alloc_x100_lead": ("100 % load: lead over the next, per seed (95 % interval)", "text"),
    "alloc_x130": ("GPUs allocated, 130 % load", "pct"),
    "frag_rate_x50": ("idle GPU fragmented, 50 % load", "pct"),
    "frag_rate_x90": ("idle GPU fragmented, 90 % load", "pct"),
    "failed_pods": ("pods that found no place", "count"),
}
# the time replay's columns in three tables, so that each fits a 1,280 px window without scrolling
REPLAY_COLS = {
    "completed": ("jobs completed", "count"),
    "avg_jct_s": ("average JCT", "s"),
    "median_jct_s": ("median JCT", "s"),
    "p95_jct_s": ("95th percentile JCT", "s"),
    "avg_wait_s": ("average wait", "s"),
    "p95_wait_s": ("95th percentile wait", "s"),
    "makespan_s": ("makespan", "s"),
    "gpu_alloc_pct": ("GPUs allocated (time average)", "pct"),
}
REPLAY_HEALTH_COLS = {
    "deadlocked": ("deadlocked jobs", "count"),
    "starved": ("starved jobs", "count"),
    "restarts": ("restarts", "count"),
    "max_wait_large_s": ("longest wait of an 8+ GPU job", "s"),
    "evictions": ("evictions", "count"),
    "lost_gpu_h_preempt": ("GPU-hours lost to preemption", "gpuh"),
    "jain_index": ("Jain's fairness index", "ratio"),
    "eta_median_abs_s": ("start forecast: median error", "s"),
    "eta_bias_s": ("start forecast: mean bias", "s"),
}
IO_COLS = {
    "io_wait_gpu_h": ("GPU-hours lost waiting on input", "gpuh"),
    "io_wait_avg_s": ("average input wait per job", "s"),
    "io_warm_start_pct": ("starts with the dataset already cached", "pct"),
    "io_staged_tb": ("TB copied into node caches", "ratio"),
}
PAST_TUNE = "past the load submitted (--tune)"
MISSING = {
    **{f"alloc_x{x}": PAST_TUNE for x in (50, 90, 100, 130)},
    **{f"frag_rate_x{x}": PAST_TUNE for x in (50, 90)},
    "makespan_s": "not every job completed",
    "jain_index": "never two queues wanting GPUs",
    "max_wait_large_s": "no job of 8+ GPUs",
    "eta_median_abs_s": "no forecast made",
    "eta_bias_s": "no forecast made",
    "io_warm_start_pct": "no job read a dataset",
    "io_wait_avg_s": "no job read a dataset",
}


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
    verdicts: list[str] = []
    for e in fgd:
        summary = e.summary_rows()
        seeds = per_seed(e)
        for row in summary:
            sp = Spread.of(seeds.get(str(row["profile"]), []))
            row.update(alloc_x100_min=round(sp.lo, 2), alloc_x100_max=round(sp.hi, 2))
            row["alloc_x100_ci95"] = round(sp.half, 2)
        rows += summary
        verdicts.append(fgd_headline(e.name, seeds))
        leads = lead_cells(seeds)
        shown = [
            {
                **row,
                "alloc_x100_spread": _spread_cell(row),
                "alloc_x100_lead": leads.get(str(row["profile"]), "-"),
            }
            for row in summary
        ]
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
                f"{len(e.nodes):,} nodes, {len(e.pods):,} pods in the list, submitted until "
                f"{e.tune:g}x the GPU capacity; seeds {', '.join(map(str, e.seeds))}, the same pod "
                "sequences for every profile. Allocation and fragmentation: mean over the seeds; lines: "
                "the mean, bands: min to max over the seeds. A profile is said to be ahead only when "
                "its per-seed lead is larger than that lead's 95 % interval over the seeds. "
                f"{note}",
                shown,
                [("", FGD_COLS)],
                [(a.name, "GPU allocation against arrived load"), (f.name, "Fragmented share of idle GPU")],
            )
        )
    for r in replays:
        summary = r.summary_rows()
        rows += summary
        verdicts.append(replay_headline(r.name, summary))
        split = split_sentence(summary, r.results)
        if split:
            verdicts.append(split)
        figs = [
            (plots.jct_cdf(r, out / f"jct-cdf-{slug(r.name)}.png").name, "Job completion times"),
            (
                plots.gpu_over_time(r, out / f"gpu-time-{slug(r.name)}.png").name,
                "GPUs allocated over time, one panel per profile",
            ),
        ]
        if len({j.queue for j in r.jobs}) > 1:  # one queue: nothing to compare between queues
            figs += [
                (
                    plots.wait_by_queue(r, out / f"wait-queue-{slug(r.name)}.png").name,
                    "Waiting time per queue",
                ),
                (
                    plots.queue_shares(r, out / f"queue-share-{slug(r.name)}.png").name,
                    "Queue use against fair share",
                ),
            ]
        rt = r.runtime.spec
        factors = ", ".join(
            f"{n} {'on' if getattr(rt, n).enabled else 'off'}" for n in ("spread", "cache", "sharing")
        )
        sections.append(
            _section(
                f"Time replay: {r.name}",
                f"{len(r.jobs):,} jobs on {len(r.nodes):,} nodes "
                f"({sum(len(n.gpus) for n in r.nodes):,} GPUs). Runtime model: {factors}. Jobs without "
                f"checkpoint times checkpoint every {r.checkpoint_interval:g} s; an evicted job loses the "
                "work since its last one. Jain's index: usage / fair share over the queues that want GPUs, "
                "time-averaged while two or more do (1 = fair). Start forecast: made when a job arrives "
                "and has to wait, compared with when it started."
                + (
                    f" Input I/O: data cache {r.data_cache} (runtime.yaml io:; docs/datasets.md)."
                    if r.data_cache
                    else ""
                ),
                summary,
                [
                    ("Completion", REPLAY_COLS),
                    ("Gangs, queues, preemption and the start forecast", REPLAY_HEALTH_COLS),
                    *([("Input I/O", IO_COLS)] if r.data_cache else []),
                ],
                figs,
            )
        )
    write_metrics(rows, out / "metrics.csv")
    (out / "style.css").write_bytes(asset("style.css"))
    index = out / "index.html"
    index.write_text(_page(title, verdicts, sections, notes))
    return index


def _spread_cell(row: dict[str, object]) -> str:
    lo, hi, half = row.get("alloc_x100_min"), row.get("alloc_x100_max"), row.get("alloc_x100_ci95")
    if not isinstance(lo, float) or lo != lo or not isinstance(hi, float):
        return "-"
    ci = f"; ±{half:.2f}" if isinstance(half, float) and half == half else "; one seed"
    return f"{lo:.2f}-{hi:.2f}{ci}"


def _section(
    heading: str,
    intro: str,
    rows: list[dict[str, object]],
    tables: list[tuple[str, dict[str, tuple[str, str]]]],
    figures: list[tuple[str, str]],
) -> str:
    body = "".join(_table(caption, rows, cols) for caption, cols in tables)
    figs = "".join(
        f'<figure><img src="{html.escape(src)}" alt="{html.escape(cap)}">'
        f"<figcaption>{html.escape(cap)}</figcaption></figure>"
        for src, cap in figures
    )
    return (
        f"<section><h2>{html.escape(heading)}</h2><p>{html.escape(intro)}</p>"
        f'{body}<div class="grid">{figs}</div></section>'
    )


def _table(caption: str, rows: list[dict[str, object]], cols: dict[str, tuple[str, str]]) -> str:
    shown = [c for c in cols if any(c in r for r in rows)]
    if not shown:
        return ""
    head = "<th>profile</th>" + "".join(
        f'<th class="num">{html.escape(cols[c][0])}{_unit(cols[c][1])}</th>' for c in shown
    )
    body = ""
    for r in rows:
        cells = "".join(f'<td class="num">{html.escape(_fmt(c, cols[c][1], r.get(c)))}</td>' for c in shown)
        body += f'<tr><td class="name">{html.escape(str(r["profile"]))}</td>{cells}</tr>'
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return (
        f'<div class="scroll"><table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'
    )


def _unit(kind: str) -> str:
    return {"pct": " (%)", "s": " (s)", "gpuh": " (GPU-h)"}.get(kind, "")


def _fmt(col: str, kind: str, v: object) -> str:
    if v is None or v == "":
        return "-"
    if isinstance(v, float) and v != v:
        return f"n/a: {MISSING.get(col, 'not measured')}"
    if not isinstance(v, int | float):
        return str(v)
    if kind == "count":
        return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.1f}"
    if kind == "pct":
        return f"{v:.1f}"
    if kind == "ratio":
        return f"{v:.3f}"
    if kind == "gpuh":
        return f"{v:,.1f}"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.1f}"


def _page(title: str, verdicts: list[str], sections: list[str], notes: Sequence[str]) -> str:
    lead = " ".join(html.escape(v) for v in verdicts if v)
    note_html = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title><link rel="stylesheet" href="style.css"><link rel="icon" href="data:,">
<style>td.name {{ white-space: nowrap; }} .grid {{ margin-top: 12px; }}
caption {{ text-align: left; font-weight: 600; padding: 10px 0 4px; }}</style>
</head><body>
<header><h1>{html.escape(title)}</h1></header>
<main>
<p class="lead" id="verdict">{lead}</p>
<section><h2>Inputs</h2><ul>{note_html}</ul>
<p class="note">Files: <a href="metrics.csv">metrics.csv</a> (every figure below),
<a href="decisions.jsonl">decisions.jsonl</a> (every decision).</p></section>
{"".join(sections)}
</main></body></html>
"""
