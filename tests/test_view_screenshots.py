"""Each environment's trajectory page in headless Chromium, on one episode the scripted expert played: the page
shows that environment's own elements (a transcript with a score column, the checker's verdicts, the screenshots,
the diff and test results, the terminal) and nothing from the store runs. Each page's screenshot goes to the
test's tmp folder, or to docs/images/envs/ENV.png with OMRL_UPDATE_SCREENSHOTS=1 (what docs/guides/view.md shows).

An environment whose engine is not installed here is skipped by name (omrl.envs.unavailable says why)."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
if not (Path(CHROMIUM).is_file() and Path(CHROMEDRIVER).is_file()):
    pytest.skip("headless browser tests need Debian's chromium and chromium-driver", allow_module_level=True)
pytest.importorskip("selenium", reason="browser tests need selenium (pip install selenium)")
pytest.importorskip("uvicorn")

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

from omrl import sandbox  # noqa: E402
from omrl.envs import env_class, generate_tasks, unavailable  # noqa: E402
from omrl.errors import OmrlError  # noqa: E402
from omrl.policies.scripted import ScriptedPolicy  # noqa: E402
from omrl.rollout import collect  # noqa: E402
from omrl.store import Store  # noqa: E402
from omrl.view.app import make_app  # noqa: E402
from tests.cases.escapes import serve_app  # noqa: E402

pytestmark = pytest.mark.slow  # a real browser and one episode of each environment

ROOT = Path(__file__).resolve().parents[1]
DOCS_IMAGES = ROOT / "docs" / "images" / "envs"
REAL_DATA = ROOT.parent / "shared" / "data" / "real"
MAX_HEIGHT = 1600  # a screenshot shows the page's top: the environment's view and the start of the conversation

# env -> the CSS selectors its page must show (generic envs: the chat view alone)
EXPECTED = {
    "math": ["#thread .msg.role-tool"], "grid": ["#thread .msg.role-assistant"], "shop": ["#thread .call"],
    "code": ["#thread .call"],
    "textworld": ["#transcript th.score", "#transcript td.score"],
    "twx": ["#transcript th.score", "#transcript td.score"],
    "scienceworld": ["#transcript th.score", "#transcript td.score"],
    "bfcl": ["#bfcl .user-turn .verdict", "#bfcl .bfcl-call", "#bfcl .checker"],
    "miniwob": ["#web-actions img.screenshot"],
    "swe": ["#diff-block .d-add", "#test-results", "#swe-verdict"],
    "os": ["#terminal .term-cmd", "#terminal .term-final"],
}


def _tasks(env: str, tmp: Path) -> tuple[list, dict]:
    """One task of `env` and the environment's options (what its docs page says to run offline)."""
    if env == "os":
        if not sandbox.sandbox_status()[0] or not (REAL_DATA / "agentbench_os_dev.json").is_file():
            raise LookupError("the os env needs bubblewrap and AgentBench's agentbench_os_dev.json")
        return generate_tasks("os", n=1, source=str(REAL_DATA / "agentbench_os_dev.json")), {}
    if env == "swe":
        if not sandbox.sandbox_status()[0]:
            raise LookupError("the swe env needs bubblewrap")
        from tests.cases.swe_hacks import TINYCALC, build_sdist

        return generate_tasks("swe", n=1, packages=[build_sdist(tmp, TINYCALC, "0.1")]), {}
    if env == "miniwob":
        return generate_tasks("miniwob", n=1, tasks="enter-text"), {"screenshots": True}
    return generate_tasks(env, n=1, seed=0), {}


@pytest.fixture(scope="module")
def played(tmp_path_factory) -> tuple[Store, dict[str, str], dict[str, str]]:
    """A store of one scripted episode per environment: (store, env -> trajectory id, env -> why skipped)."""
    tmp = tmp_path_factory.mktemp("view-envs")
    store = Store.create(tmp / "store")
    skipped: dict[str, str] = {}
    for env in EXPECTED:
        reason = unavailable(env_class(env))
        if reason:
            skipped[env] = reason
            continue
        try:
            tasks, options = _tasks(env, tmp)
        except (LookupError, OmrlError, ImportError) as exc:
            skipped[env] = str(exc)
            continue
        result = asyncio.run(collect(env, tasks[:1], ScriptedPolicy(), store, env_options=options, run_id=env))
        assert result.errors == 0, f"{env}: the scripted episode failed"
    ids = {r["env"]: r["id"] for r in store.sql("SELECT env, id FROM trajectories").to_pylist()}
    return store, ids, skipped


@pytest.fixture(scope="module")
def server(played):
    with serve_app(make_app(played[0])) as url:
        yield url


@pytest.fixture(scope="module")
def driver():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,900", "--hide-scrollbars", "--disable-extensions", "--no-first-run"):
        options.add_argument(arg)
    d = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    d.set_page_load_timeout(30)
    yield d
    d.quit()


def _screenshot_path(env: str, tmp_path: Path) -> Path:
    if os.environ.get("OMRL_UPDATE_SCREENSHOTS") == "1":
        DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
        return DOCS_IMAGES / f"{env}.png"
    return tmp_path / f"{env}.png"


@pytest.mark.parametrize("env", list(EXPECTED))
def test_environment_page_in_chromium(env, played, server, driver, tmp_path):
    _, ids, skipped = played
    if env in skipped:
        pytest.skip(f"{env} cannot run here: {skipped[env]}")
    driver.get(f"{server}/t/{ids[env]}")
    assert driver.find_element(By.ID, "thread").is_displayed()
    for selector in EXPECTED[env]:
        found = driver.find_elements(By.CSS_SELECTOR, selector)
        assert found and found[0].is_displayed(), f"{env}: no {selector} on the page"
    has_view = bool(driver.find_elements(By.ID, "env-view"))
    assert has_view == any(s.startswith(("#transcript", "#bfcl", "#web-actions", "#diff", "#terminal"))
                           for s in EXPECTED[env])
    if env == "miniwob":  # the stored PNG decoded and drawn (the page's CSP allows data: images)
        image = driver.find_element(By.CSS_SELECTOR, "#web-actions img.screenshot")
        assert driver.execute_script("return arguments[0].complete && arguments[0].naturalWidth", image) > 0
    metadata = driver.find_element(By.ID, "metadata")
    assert metadata.get_attribute("open") is None  # folded: the page opens on the conversation
    problems = [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
    assert problems == []
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1280, min(max(height, 600), MAX_HEIGHT))
    path = _screenshot_path(env, tmp_path)
    assert driver.save_screenshot(str(path)) and path.stat().st_size > 10_000
