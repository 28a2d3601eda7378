"""The report and the dashboard in a real browser (headless Chromium): they load clean and read well."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from e2e_kube import Kube, running, wait_for
from kube_objects import node, pod
from page_text import text, texts
from phalanx.cli.main import app
from phalanx.k8s import keys
from phalanx.k8s.view.server import serve

pytestmark = pytest.mark.browser


def _errors(chrome: Any) -> list[str]:
    return [e["message"] for e in chrome.get_log("browser") if e["level"] == "SEVERE"]


def test_report_reads_well(chrome: Any, tmp_path: Path, artifacts: Path) -> None:
    out = tmp_path / "report"
    res = CliRunner().invoke(app, ["simulate", "--out", str(out)])
    assert res.exit_code == 0, res.output
    chrome.get((out / "index.html").as_uri())
    chrome.save_screenshot(str(artifacts / "report.png"))
    assert _errors(chrome) == []
    # the first screen says what was compared and what won
    verdict = chrome.find_element("id", "verdict").text
    assert "at full load" in verdict and "lowest average job completion time" in verdict
    # a win or a tie is judged against the spread over the seeds, and the page says which spread
    assert "spread over 10 seeds" in verdict
    # nothing runs off the page, and at 1,280 px no table needs to scroll sideways either
    assert chrome.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
    assert chrome.execute_script("return window.innerWidth >= 1200")
    assert chrome.execute_script(
        "return [...document.querySelectorAll('.scroll')].every(d => d.scrollWidth <= d.clientWidth)"
    )
    body = chrome.find_element("tag name", "body").text
    assert not re.search(r"\bnan\b", body, re.I), "a missing value must say why"
    heads = [th.text for th in chrome.find_elements("css selector", "th")]
    assert heads and not [h for h in heads if "_" in h], "column names are words, not field names"
    assert any("(s)" in h for h in heads) and any("(%)" in h for h in heads)
    # whole counts without decimals
    failed = chrome.find_elements("xpath", "//th[contains(., 'pods that found no place')]")
    assert failed
    col = [th.text for th in failed[0].find_elements("xpath", "../th")].index(failed[0].text) + 1
    cells = [
        td.text
        for td in chrome.find_elements(
            "xpath", f"//table[.//th[contains(., 'pods that found no place')]]//tr/td[{col}]"
        )
    ]
    # counts: whole numbers, or a mean over the seeds with one decimal
    assert cells and all(re.fullmatch(r"[\d,]+(\.\d)?", c) for c in cells), cells
    # every figure loaded, on a grid
    assert chrome.execute_script("return [...document.images].every(i => i.complete && i.naturalWidth > 0)")
    assert chrome.find_elements("css selector", ".grid figure")


@pytest.mark.e2e
def test_dashboard_shows_holders_reasons_forecasts_and_updates_live(
    chrome: Any, kube: Kube, artifacts: Path
) -> None:
    kube.api.create("nodes", node("n0", gpus=8))
    kube.api.create("nodes", node("n1", gpus=8))
    kube.create(pod("a", gpus=8, annotations={keys.ESTIMATED_RUNTIME: "1800"}))
    kube.create(pod("b", gpus=8, annotations={keys.ESTIMATED_RUNTIME: "3600"}))
    with running(kube) as s:
        server = serve(0, s.metrics, s.ready, s.board)
        try:
            wait_for("a and b bound", lambda: kube.node_of("a") and kube.node_of("b"), timeout=20)
            kube.run_pod("a", started_s_ago=600)
            kube.run_pod("b", started_s_ago=600)
            kube.create(pod("w", gpus=8))
            url = f"http://127.0.0.1:{server.server_port}/dashboard/"
            chrome.get(url)

            def row() -> str:
                shown = text(chrome, "tr[data-workload='default/w']")
                return shown if "expected to start" in shown else ""

            r = wait_for("w waiting with a reason and a forecast", row, timeout=30, every=0.5)
            assert "does not fit" in r or "GPU" in r
            chrome.save_screenshot(str(artifacts / "dashboard.png"))
            holder = kube.node_of("a")
            chrome.get(url + f"#/node/{holder}")
            gpus = wait_for(
                "the node's GPUs and holders",
                lambda: texts(chrome, "#node-gpus tr[data-gpu]"),
                timeout=15,
                every=0.3,
            )
            assert len(gpus) == 8 and all("default/a" in g for g in gpus)
            # live: a goes away, w is bound, and the open page shows it without a reload
            chrome.get(url)
            wait_for("overview", lambda: chrome.find_elements("id", "pending"), timeout=15, every=0.3)
            kube.force_delete_pod("a")
            wait_for("w bound", lambda: kube.node_of("w") == holder, timeout=30)

            def shown() -> bool:
                rec = text(chrome, "#recent")
                return "default/w" in rec and "bound" in rec

            wait_for("the bind of w on the page", shown, timeout=20, every=0.5)
            assert not chrome.find_elements("css selector", "tr[data-workload='default/w']")
            assert _errors(chrome) == []
        finally:
            server.shutdown()
    time.sleep(0.1)


def test_the_board_of_every_shard_reads_well(chrome: Any) -> None:
    """`phalanx dashboard --shards`: the shards' table, both shards' nodes on the GPU map, and each
    waiting workload with the shard that decides it, at 1,280 px without sideways scrolling."""
    from phalanx.k8s.client.cache import Store
    from phalanx.k8s.config import AdapterConfig
    from phalanx.k8s.decide.cycle import decide
    from phalanx.k8s.read.gather import gather
    from phalanx.k8s.read.shard import ShardFilter
    from phalanx.k8s.view.board import Board, build
    from phalanx.k8s.view.shard_board import merged
    from phalanx.profiles import load_profile
    from phalanx.spec.shards import ShardOf, parse_shards

    every = parse_shards(
        {"shards": [{"name": "h100", "pools": ["h100"]}, {"name": "rest", "default": True}]}, "f"
    )
    h1 = node("h1", gpus=8)
    h1["metadata"].setdefault("labels", {})["phalanx.io/node-pool"] = "h100"
    big = pod("big", gpus=8)
    big["metadata"].setdefault("labels", {})["phalanx.io/node-pool"] = "h100"
    objs = {
        "nodes": [h1, node("r1", gpus=4)],
        "pods": [pod("small", gpus=2, node="r1"), big, pod("wide", gpus=6)],
    }
    now, parts = time.time(), []
    for me in every.shards:
        cfg = AdapterConfig(shard=ShardOf(every, me))
        gate = ShardFilter(cfg.shard, cfg.scheduler_name)  # type: ignore[arg-type]
        store = Store(gate=gate)
        for kind in ("nodes", "pods"):
            store.replace(kind, objs[kind])
        world = gather(store.items, False, cfg, split=gate.split()).world(cfg, now)
        d = decide(world, load_profile("phalanx-queues"), now)
        state, details = build(world, d.result, d.foresee().texts, now, "phalanx.io/node-pool")
        state["profile"] = "phalanx-queues"
        parts.append((me, state, details))
    board = Board(mode="read-only")
    board.show(*merged(parts, now))
    server = serve(0, None, lambda: True, board)
    try:
        chrome.get(f"http://127.0.0.1:{server.server_port}/dashboard/")
        rows = wait_for(
            "the shards' table", lambda: texts(chrome, "#shards tr[data-shard]"), timeout=15, every=0.3
        )
        assert [r.split()[0] for r in rows] == ["h100", "rest"]
        wide = wait_for("wide waiting", lambda: text(chrome, "tr[data-workload='default/wide']"), timeout=10)
        assert "rest" in wide  # the shard that decides it
        assert len(chrome.find_elements("css selector", "a.node")) == 2
        assert chrome.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
        assert _errors(chrome) == []
    finally:
        server.shutdown()
