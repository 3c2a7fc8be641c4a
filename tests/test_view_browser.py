"""`omrl view` end to end in headless Chromium (selenium against Debian's /usr/bin/chromium): list, SQL
filter, inline error, trajectory, group, lineage, an exported page from disk, and XSS payloads that run
nothing. Screenshots go to the test's tmp folder. Skips only when chromium or chromedriver is absent."""

from __future__ import annotations

import http.server
import shutil
import threading
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
if not (Path(CHROMIUM).is_file() and Path(CHROMEDRIVER).is_file()):
    pytest.skip("headless browser tests need Debian's chromium and chromium-driver "
                "(apt-get install -y chromium chromium-driver)", allow_module_level=True)
pytest.importorskip("selenium", reason="browser tests need selenium (pip install selenium)")
pytest.importorskip("uvicorn")

from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import NoAlertPresentException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions as EC  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from omrl.view.app import make_app  # noqa: E402
from omrl.view.export import export_site  # noqa: E402
from omrl.view.pages import file_key  # noqa: E402
from tests.cases.escapes import serve_app  # noqa: E402
from tests.test_view import CHILD_ID, XSS_ID, build_store  # noqa: E402

pytestmark = pytest.mark.slow  # a real browser


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("view-browser") / "store")


@pytest.fixture(scope="module")
def server(store):
    with serve_app(make_app(store)) as url:
        yield url


@pytest.fixture(scope="module")
def driver():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000", "--disable-extensions", "--no-first-run"):
        options.add_argument(arg)
    d = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    d.set_page_load_timeout(30)
    yield d
    d.quit()


def _ran_nothing(driver) -> None:
    """No payload ran: the globals it would set are unset, no alert is open, and the browser logged no
    blocked script or image (escaping kept the payload text, so the CSP had nothing to refuse)."""
    assert driver.execute_script("return window.__omrl_xss === undefined")
    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert.text  # noqa: B018
    # network entries are the pages' own status codes (a refused WHERE answers 400)
    problems = [e["message"] for e in driver.get_log("browser")
                if e.get("level") == "SEVERE" and e.get("source") != "network"]
    assert problems == []


def _wait(driver, by, what):
    return WebDriverWait(driver, 10).until(EC.presence_of_element_located((by, what)))


def _submit(driver, field):
    """Submit `field`'s form and wait until the next page has replaced this one: a lookup before that finds the
    old page's elements, gone by the time they are read (a stale element)."""
    page = driver.find_element(By.TAG_NAME, "html")
    field.submit()
    WebDriverWait(driver, 10).until(EC.staleness_of(page))


def test_list_filter_and_error(driver, server, tmp_path):
    driver.get(server + "/")
    rows = driver.find_elements(By.CSS_SELECTOR, "#trajectories tbody tr")
    assert len(rows) == 50
    assert "62 trajectories" in driver.find_element(By.ID, "count").text
    driver.save_screenshot(str(tmp_path / "list.png"))
    # sort by a column header: the server orders, the page follows the link
    driver.find_element(By.CSS_SELECTOR, 'th a[data-sort="turns"]').click()
    _wait(driver, By.CSS_SELECTOR, "#trajectories")
    assert "sort=turns" in driver.current_url
    box = driver.find_element(By.ID, "where")
    box.clear()
    box.send_keys("env = 'math' AND num_turns > 3")
    _submit(driver, box)
    _wait(driver, By.ID, "count")
    shown = driver.find_elements(By.CSS_SELECTOR, "#trajectories tbody tr")
    assert shown and all(r.find_elements(By.TAG_NAME, "td")[1].text == "math" for r in shown)
    assert driver.find_elements(By.ID, "where-error") == []
    driver.save_screenshot(str(tmp_path / "filtered.png"))
    box = driver.find_element(By.ID, "where")
    box.clear()
    box.send_keys("reward >")
    _submit(driver, box)
    error = _wait(driver, By.ID, "where-error")
    assert "does not parse" in error.text
    driver.save_screenshot(str(tmp_path / "where-error.png"))
    _ran_nothing(driver)


def test_text_search_box(driver, server, tmp_path):
    pytest.importorskip("omrl.store.search", reason="the store's text search (omrl/store/search.py) is absent")
    driver.get(server + "/")
    box = driver.find_element(By.ID, "search")
    box.send_keys("evil")
    _submit(driver, box)
    _wait(driver, By.ID, "count")
    assert "2 trajectories" in driver.find_element(By.ID, "count").text
    assert {a.get_attribute("href").rsplit("/", 1)[-1] for a in driver.find_elements(By.CSS_SELECTOR, "a.tlink")
            } == {XSS_ID, CHILD_ID}
    driver.save_screenshot(str(tmp_path / "search.png"))
    _ran_nothing(driver)
    box = driver.find_element(By.ID, "search")
    box.clear()
    box.send_keys('"unclosed')
    _submit(driver, box)
    assert "unclosed quote" in _wait(driver, By.ID, "search-error").text


def test_trajectory_group_lineage_and_xss(driver, server, tmp_path):
    driver.get(server + "/?where=" + "id LIKE 'xss%25'")
    links = driver.find_elements(By.CSS_SELECTOR, "a.tlink")
    assert len(links) == 2
    driver.get(server + f"/t/{XSS_ID}")
    _wait(driver, By.ID, "thread")
    _ran_nothing(driver)
    # the payload is on the page as text, not as markup
    assert "<script>window.__omrl_xss = 1; alert(1)</script>" in driver.find_element(By.ID, "thread").text
    assert driver.find_elements(By.CSS_SELECTOR, "#thread img") == []
    # our own script ran (the CSP allows it) and filled in the deep link
    assert driver.execute_script("return document.documentElement.dataset.viewJs") == "ready"
    assert driver.find_element(By.ID, "deeplink").get_attribute("value") == server + f"/t/{XSS_ID}"
    fold = driver.find_element(By.CSS_SELECTOR, "details.fold")
    assert fold.get_attribute("open") is None
    fold.find_element(By.TAG_NAME, "summary").click()
    assert fold.get_attribute("open") is not None
    driver.save_screenshot(str(tmp_path / "trajectory.png"))
    driver.find_element(By.CSS_SELECTOR, "a.child-link").click()
    _wait(driver, By.CSS_SELECTOR, "a.parent-link")
    assert driver.current_url.endswith(f"/t/{CHILD_ID}")
    driver.find_element(By.CSS_SELECTOR, "a.parent-link").click()
    _wait(driver, By.ID, "group-link")
    assert driver.current_url.endswith(f"/t/{XSS_ID}")
    driver.find_element(By.ID, "group-link").click()
    _wait(driver, By.ID, "samples")
    assert len(driver.find_elements(By.CSS_SELECTOR, "#samples .sample")) == 2
    _ran_nothing(driver)
    driver.save_screenshot(str(tmp_path / "group.png"))
    driver.find_element(By.CSS_SELECTOR, "a.diff-link").click()
    _wait(driver, By.ID, "diff")
    assert "identical message" in driver.find_element(By.ID, "diff").text
    _ran_nothing(driver)
    driver.save_screenshot(str(tmp_path / "diff.png"))
    driver.get(server + "/runs")
    assert driver.find_elements(By.CSS_SELECTOR, "#chart-env rect")
    # the per-step line is drawn (a real extent on screen, coloured by the stylesheet, not filled black)
    line = driver.find_element(By.CSS_SELECTOR, "#chart-step-success polyline")
    assert line.size["width"] > 100
    assert driver.execute_script("return getComputedStyle(arguments[0]).fill", line) == "none"
    # judge vs environment per step: r per step drawn, the table lists the judge's 4 steps
    agreement = driver.find_element(By.CSS_SELECTOR, "#chart-step-agreement polyline")
    assert agreement.size["width"] > 100
    assert len(driver.find_elements(By.CSS_SELECTOR, "#step-agreement tbody tr")) == 4
    driver.save_screenshot(str(tmp_path / "runs.png"))
    _ran_nothing(driver)


def test_exported_pages_from_disk(driver, store, tmp_path):
    out = tmp_path / "site"
    export_site(store, out, where="id LIKE 'xss%' OR env = 'sql'", limit=50)
    driver.get((out / "index.html").as_uri())
    links = driver.find_elements(By.CSS_SELECTOR, "a.tlink")
    assert links
    _ran_nothing(driver)
    driver.get((out / "t" / f"{file_key(CHILD_ID)}.html").as_uri())
    _wait(driver, By.CSS_SELECTOR, "a.parent-link").click()
    _wait(driver, By.ID, "thread")
    assert driver.current_url == (out / "t" / f"{file_key(XSS_ID)}.html").as_uri()
    _ran_nothing(driver)
    assert driver.execute_script("return document.documentElement.dataset.viewJs") == "ready"
    assert driver.find_element(By.ID, "deeplink").get_attribute("value").startswith("file://")
    # the stylesheet loaded from the export's own static folder (relative link)
    assert driver.execute_script(
        "return getComputedStyle(document.querySelector('header.top')).display") == "flex"
    driver.save_screenshot(str(tmp_path / "exported.png"))
    driver.find_element(By.ID, "group-link").click()
    _wait(driver, By.ID, "samples")
    _ran_nothing(driver)


def test_exported_list_pages_from_disk(driver, store, tmp_path):
    """A paged export opened from disk: next/prev links walk the pages; each page's rows open."""
    out = tmp_path / "paged"
    done = export_site(store, out, limit=12, per_page=5)
    assert done.pages == 3
    driver.get((out / "index.html").as_uri())
    seen = []
    for number in (1, 2, 3):
        rows = driver.find_elements(By.CSS_SELECTOR, "#trajectories tbody tr")
        assert len(rows) == (5 if number < 3 else 2)
        assert f"page {number} of 3" in driver.find_element(By.ID, "count").text
        seen += [a.get_attribute("href") for a in driver.find_elements(By.CSS_SELECTOR, "a.tlink")]
        _ran_nothing(driver)
        if number < 3:
            driver.find_element(By.CSS_SELECTOR, 'nav.pager a[rel="next"]').click()
            _wait(driver, By.ID, "count")
    assert driver.current_url == (out / "page-3.html").as_uri()
    assert driver.find_elements(By.CSS_SELECTOR, 'nav.pager a[rel="next"]') == []
    driver.save_screenshot(str(tmp_path / "export-page-3.png"))
    assert len(set(seen)) == 12
    driver.find_element(By.CSS_SELECTOR, 'nav.pager a[rel="prev"]').click()
    _wait(driver, By.ID, "count")
    assert driver.current_url == (out / "page-2.html").as_uri()
    driver.get(seen[-1])
    _wait(driver, By.ID, "thread")
    _ran_nothing(driver)


def _walk_list(driver, url: str) -> list[str]:
    """The hrefs of every trajectory link of a list, from `url` through its next links."""
    driver.get(url)
    hrefs = []
    while True:
        _wait(driver, By.ID, "count")
        hrefs += [a.get_attribute("href") for a in driver.find_elements(By.CSS_SELECTOR, "a.tlink")]
        _ran_nothing(driver)
        nxt = driver.find_elements(By.CSS_SELECTOR, 'nav.pager a[rel="next"]')
        if not nxt:
            return hrefs
        nxt[0].click()


def test_exported_search_is_the_live_list_from_disk(driver, server, store, tmp_path):
    """`--export --search --where` opened from disk lists exactly what the served viewer lists for the same
    search box and WHERE box, in the same order; each exported row opens its trajectory."""
    pytest.importorskip("omrl.store.search", reason="the store's text search (omrl/store/search.py) is absent")
    from urllib.parse import unquote

    driver.get(server + "/")
    driver.find_element(By.ID, "search").send_keys("function")
    where = driver.find_element(By.ID, "where")
    where.send_keys("reward >= 0.3")
    _submit(driver, where)
    _wait(driver, By.ID, "count")
    live = [unquote(h.rsplit("/t/", 1)[1]) for h in _walk_list(driver, driver.current_url)]
    assert len(live) > 8 and len(set(live)) == len(live)  # the export (4 rows a file) spans several files
    out = tmp_path / "searched"
    export_site(store, out, where="reward >= 0.3", search="function", per_page=4)
    exported = _walk_list(driver, (out / "index.html").as_uri())
    assert exported == [(out / "t" / f"{file_key(i)}.html").as_uri() for i in live]
    assert "function" in driver.find_element(By.ID, "export-search").text
    driver.save_screenshot(str(tmp_path / "export-search.png"))
    driver.get(exported[-1])
    _wait(driver, By.ID, "thread")
    _ran_nothing(driver)


def test_a_long_message_opens_whole_and_other_sites_are_refused(driver, tmp_path):
    """A cut message's link opens its whole text (a same-origin navigation passes); a page on another site
    (localhost is not 127.0.0.1) can neither load the viewer's files as images nor open its pages."""
    from omrl.store import Store
    from omrl.testing.synthetic import synthetic_trajectories

    store = Store.create(tmp_path / "store")
    row = dict(next(iter(synthetic_trajectories(1, seed=3))), id="long")
    row["messages"] = [{"role": "user", "content": "hi"},
                       {"role": "tool", "content": "line of output\n" * 3000 + "<script>window.__omrl_xss = 4</script>"}]
    store.append([row])
    with serve_app(make_app(store)) as url:
        driver.get(url + "/t/long")
        driver.find_element(By.CSS_SELECTOR, "details.fold summary").click()
        _wait(driver, By.CSS_SELECTOR, "a.full-text").click()
        whole = _wait(driver, By.ID, "full-text")
        assert whole.text.endswith("<script>window.__omrl_xss = 4</script>")
        _ran_nothing(driver)
        driver.find_element(By.CSS_SELECTOR, "a.back-link").click()
        _wait(driver, By.ID, "thread")

        port = url.rsplit(":", 1)[1]
        page = (f'<img id="probe" src="{url}/static/favicon.svg"><a id="go" href="{url}/runs">viewer</a>').encode()

        class Foreign(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.end_headers()
                self.wfile.write(page)

            def log_message(self, *args):
                pass

        foreign = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Foreign)
        threading.Thread(target=foreign.serve_forever, daemon=True).start()
        try:
            driver.get(f"http://localhost:{foreign.server_address[1]}/")
            probe = _wait(driver, By.ID, "probe")
            WebDriverWait(driver, 10).until(lambda d: d.execute_script("return arguments[0].complete", probe))
            assert driver.execute_script("return arguments[0].naturalWidth", probe) == 0  # refused: no image
            driver.find_element(By.ID, "go").click()
            WebDriverWait(driver, 10).until(lambda d: port in d.current_url)
            assert "refused" in driver.find_element(By.TAG_NAME, "body").text
            driver.get(url + "/static/favicon.svg")  # typed in: served
            assert "svg" in driver.page_source
        finally:
            foreign.shutdown()
            foreign.server_close()
