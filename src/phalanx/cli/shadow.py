"""`phalanx scheduler --shadow` (decide beside another scheduler, write nothing) and
`phalanx status --shadow URL` (what a running shadow has found)."""

from __future__ import annotations

import json
import logging
import signal
import ssl
import urllib.request
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from phalanx.cli.errors import user_errors
from phalanx.cli.serving import serving_tls
from phalanx.cli.tables import name_column, print_table
from phalanx.core.errors import SpecError
from phalanx.core.profile import Profile
from phalanx.k8s.client.api import Api
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.loop.shadow import Shadow
from phalanx.k8s.view.authn import Guard
from phalanx.k8s.view.server import serve

log = logging.getLogger("phalanx.k8s")


def run_shadow(
    api: Api,
    cfg: AdapterConfig,
    profile: Profile,
    port: int,
    insecure_metrics: bool,
    tls_files: tuple[Path | None, Path | None],
    bind_address: str,
) -> None:
    s = Shadow(api, cfg, profile)
    with user_errors():
        if insecure_metrics:
            server = serve(port, s.metrics, s.ready, s.board, address=bind_address)
        else:
            tls = serving_tls(*tls_files)
            server = serve(port, s.metrics, s.ready, s.board, guard=Guard(api), tls=tls, address=bind_address)
    log.info(
        "shadow mode: watching the pods of %r, binding and evicting nothing; %s://%s:%d/metrics "
        "(phalanx_shadow_decisions_total) and /dashboard/",
        cfg.scheduler_name,
        "http" if insecure_metrics else "https",
        bind_address,
        server.server_port,
    )
    signal.signal(signal.SIGTERM, lambda *_: s.stop())
    s.start()
    try:
        s.run()
    except KeyboardInterrupt:
        pass
    finally:
        s.close()
        server.shutdown()


def fetch_summary(url: str, token: str, verify: bool) -> dict[str, object]:
    """The shadow's summary from its dashboard state (`URL/dashboard/state.json`)."""
    base = url.rstrip("/")
    req = urllib.request.Request(base + "/dashboard/state.json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    ctx = None
    if base.startswith("https://"):
        ctx = ssl.create_default_context()
        if not verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            body = json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise SpecError(
            "--shadow", f"{base} answered {e.code}: {e.read()[:200].decode(errors='replace')}"
        ) from None
    except (OSError, ValueError) as e:
        raise SpecError("--shadow", f"cannot read {base}/dashboard/state.json: {e}") from None
    shadow = body.get("shadow") if isinstance(body, dict) else None
    if not isinstance(shadow, dict) or not shadow:
        raise SpecError("--shadow", f"{base} is not a shadow scheduler (or it has not run a cycle yet)")
    return shadow


def print_summary(s: dict[str, object]) -> None:
    console = Console()
    judged, agreed = int(str(s.get("judged", 0))), int(str(s.get("agreed", 0)))
    pct = f" ({100 * agreed / judged:.0f}%)" if judged else ""
    console.print(
        f"Shadow of {s.get('scheduler')} ({s.get('profile')}): {judged} placement(s) judged, "
        f"{agreed} agreed{pct}.",
        highlight=False,
    )
    rows = s.get("by_reason") or []
    if isinstance(rows, list) and rows:
        t = Table(title="Agreements and disagreements")
        name_column(t, "verdict")
        for col in ("reason", "pods"):
            t.add_column(col)
        for r in rows:
            t.add_row(str(r["verdict"]), str(r["reason"]), str(r["pods"]))
        print_table(t, console)
    partial = s.get("partial_gangs") or {}
    if isinstance(partial, dict):
        for name, text in partial.items():
            console.print(
                f"[yellow]gang placed partially by {s.get('scheduler')}:[/] {name}: {text}", highlight=False
            )
    place = s.get("would_place_now") or []
    if isinstance(place, list) and place:
        console.print(
            f"Phalanx would place now, {s.get('scheduler')} leaves waiting: {', '.join(map(str, place))}"
        )
    recent = s.get("recent") or []
    if isinstance(recent, list) and recent:
        t = Table(title="Latest judged placements")
        for col in ("pod", str(s.get("scheduler") or "scheduler"), "Phalanx", "verdict"):
            name_column(t, col)  # pod and node names, whole
        t.add_column("reason")
        for v in recent[:20]:
            t.add_row(v["pod"], v["real"], v["ours"] or "wait", v["verdict"], v["reason"])
        print_table(t, console)


def status_shadow(url: str, token: str, verify: bool) -> None:
    with user_errors():
        summary = fetch_summary(url, token, verify)
    print_summary(summary)


__all__ = ["fetch_summary", "print_summary", "run_shadow", "status_shadow", "typer"]
