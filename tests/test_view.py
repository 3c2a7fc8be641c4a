"""`omrl view`: the viewer's pages through Starlette's TestClient, and the static export."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

try:  # the view extra, and the TestClient's transport (httpx or httpx2)
    from starlette.testclient import TestClient
except (ImportError, RuntimeError) as exc:
    pytest.skip(f"omrl view tests need starlette and httpx (pip install 'omrl[view]' httpx): {exc}",
                allow_module_level=True)

from click.testing import CliRunner  # noqa: E402

from omrl.cli.main import cli  # noqa: E402
from omrl.errors import OmrlError  # noqa: E402
from omrl.schema import Annotation, is_failed  # noqa: E402
from omrl.store import Store  # noqa: E402
from omrl.testing.synthetic import synthetic_trajectories  # noqa: E402
from omrl.view.app import make_app  # noqa: E402
from omrl.view.export import export_site  # noqa: E402
from omrl.view.pages import file_key, fmt  # noqa: E402

XSS_SCRIPT = "<script>window.__omrl_xss = 1; alert(1)</script>"
XSS_IMG = "<img src=x onerror=\"window.__omrl_xss = 2\">"
XSS_ID = "xss-trajectory"
CHILD_ID = "xss-child"


def build_store(path: Path, n: int = 60) -> Store:
    """A store of `n` synthetic rows, one trajectory carrying XSS payloads everywhere text is shown, a
    child derived from it, and a judge annotation with a rationale."""
    store = Store.create(path)
    rows = list(synthetic_trajectories(n, seed=1))
    for i, row in enumerate(rows[:40]):  # GRPO rollouts of 4 steps, tagged as omrl.train.data.rollout_func does
        row["metadata"] = json.dumps({"grpo_step": i % 4, "grpo_round": 0})
    evil = dict(rows[0])
    evil.update(
        id=XSS_ID, task_id=f"task {XSS_SCRIPT}", model=XSS_IMG, group_id="xss-group", sample=0,
        instruction=XSS_SCRIPT,
        messages=[
            {"role": "system", "content": "You are evil " + XSS_IMG},
            {"role": "user", "content": XSS_SCRIPT},
            {"role": "assistant", "content": "calling " + XSS_IMG,
             "tool_calls": [{"id": "c0", "name": "run<script>", "arguments": json.dumps({"code": XSS_SCRIPT})}]},
            {"role": "tool", "tool_call_id": "c0", "name": "run", "content": ("x" * 2000) + XSS_IMG},
        ],
        turns=[{"index": 0, "reward": 0.5, "done": True, "latency_s": 1.25, "prompt_tokens": 11,
                "completion_tokens": 7, "info": "{}"}],
        num_turns=1, reward=0.5, metadata=json.dumps({"note": XSS_SCRIPT}),
    )
    child = dict(evil, id=CHILD_ID, parent_id=XSS_ID, source="augmented:paraphrase", sample=1, reward=1.0,
                 success=True, model="synthetic-policy", task_id="child task")
    store.append(rows + [evil, child])
    store.append([Annotation(trajectory_id=XSS_ID, annotator="judge", score=0.25,
                             rationale="The agent wrote " + XSS_SCRIPT, judge_model="fake-judge").to_row(),
                  Annotation(trajectory_id=XSS_ID, annotator="metric", status="error",
                             error="metric crashed").to_row()]
                 # a judge of the GRPO rollouts (per-step agreement on the runs page)
                 + [Annotation(trajectory_id=r["id"], annotator="step-judge", score=r["reward"]).to_row()
                    for r in rows[:40] if r["reward"] is not None],
                 table="annotations")
    return store


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Store:
    return build_store(tmp_path_factory.mktemp("view") / "store")


@pytest.fixture(scope="module")
def client(store):
    with TestClient(make_app(store), base_url="http://127.0.0.1") as c:
        yield c


def _trajectory_links(page: str) -> list[str]:
    return re.findall(r'class="tlink" href="([^"]+)"', page)


def _no_raw_payload(page: str) -> None:
    assert "<script>window" not in page and "<script>alert" not in page
    assert "<img src=x" not in page and "onerror=\"window" not in page
    scripts = re.findall(r"<script[^>]*>", page)
    assert all(re.fullmatch(r'<script src="[^"]*view\.js" defer>', s) for s in scripts), scripts


def test_list_page_and_headers(client):
    response = client.get("/")
    assert response.status_code == 200
    page = response.text
    assert "62 trajectories" in page and "page 1 of 2" in page
    assert len(_trajectory_links(page)) == 50
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp and "unsafe-inline" not in csp
    assert response.headers["x-content-type-options"] == "nosniff"
    assert client.get("/static/view.js").status_code == 200
    assert "content-security-policy" in client.get("/static/view.css").headers


def test_sort_and_page(client, store):
    ordered = store.sql("SELECT id FROM trajectories ORDER BY num_turns DESC NULLS LAST, id").column(0).to_pylist()
    first = client.get("/?sort=turns&dir=desc").text
    assert _trajectory_links(first)[:50] == [f"/t/{i}" for i in ordered[:50]]
    second = client.get("/?sort=turns&dir=desc&page=2").text
    assert _trajectory_links(second) == [f"/t/{i}" for i in ordered[50:]]
    ascending = client.get("/?sort=turns&dir=asc").text
    assert _trajectory_links(ascending)[0] == f"/t/{ordered[-1]}" or "page 1 of 2" in ascending
    # an unknown sort key or a page out of range falls back instead of reaching SQL
    assert client.get("/?sort=id;DROP&page=999").status_code == 200
    assert "page 2 of 2" in client.get("/?page=999").text


def test_where_filter(client, store):
    expected = store.sql("SELECT count(*) FROM trajectories WHERE env = 'math' AND success").column(0)[0].as_py()
    page = client.get("/", params={"where": "env = 'math' AND success"}).text
    assert f"{expected} trajectories" in page
    assert 'value="env = &#39;math&#39; AND success"' in page  # the box keeps the condition, escaped
    one = client.get("/", params={"where": f"id = '{CHILD_ID}'"}).text
    assert _trajectory_links(one) == [f"/t/{CHILD_ID}"]
    text = client.get("/", params={"where": "id IN (SELECT trajectory_id FROM messages "
                                            "WHERE content ILIKE '%onerror%')"}).text
    assert sorted(_trajectory_links(text)) == [f"/t/{CHILD_ID}", f"/t/{XSS_ID}"]
    judged = client.get("/", params={"where": "id IN (SELECT trajectory_id FROM latest_annotations WHERE annotator = 'judge')"}).text
    assert _trajectory_links(judged) == [f"/t/{XSS_ID}"]
    past = client.get("/", params={"where": "reward >= 0", "page": 99, "sort": "turns"}).text
    n = store.sql("SELECT count(*) FROM trajectories WHERE reward >= 0").column(0)[0].as_py()
    assert f"{n} trajectories · page 2 of 2" in past and len(_trajectory_links(past)) == n - 50
    none = client.get("/", params={"where": "reward > 99", "page": 3}).text
    assert "0 trajectories" in none and _trajectory_links(none) == []


@pytest.mark.parametrize("where, message", [
    ("reward >", "does not parse"),
    ("no_such_column = 1", "no_such_column"),
    ("true) UNION SELECT * FROM trajectories --", "refused"),
    ("1=1; DROP TABLE trajectories", "refused"),
    ("id IN (SELECT id FROM read_parquet('/etc/passwd'))", "refused"),
])
def test_bad_where_error_inline(client, where, message):
    response = client.get("/", params={"where": where})
    assert response.status_code == 400
    error = re.search(r'<div class="error" id="where-error" role="alert">(.*?)</div>', response.text, re.S)
    assert error and message in html.unescape(error.group(1))
    assert 'id="where"' in response.text  # the form is still there to fix it


def test_trajectory_page(client, store):
    response = client.get(f"/t/{XSS_ID}")
    assert response.status_code == 200
    page = response.text
    assert 'class="msg role-tool"' in page and "<details class=\"fold\">" in page  # long observation folded
    assert "&#34;code&#34;: " in page  # pretty-printed arguments (escaped quotes)
    assert "turn 0 · reward 0.5 · 1.25 s · 11 + 7 tokens" in page
    assert "fake-judge" in page and "The agent wrote &lt;script&gt;" in page and "metric crashed" in page
    assert f'class="child-link" href="/t/{CHILD_ID}"' in page
    assert 'id="group-link" href="/g/xss-group"' in page
    assert 'id="deeplink"' in page
    child = client.get(f"/t/{CHILD_ID}").text
    assert f'class="parent-link" href="/t/{XSS_ID}"' in child
    assert client.get("/t/no-such-id").status_code == 404
    normal = store.sql("SELECT id FROM trajectories WHERE num_turns > 2 LIMIT 1").column(0)[0].as_py()
    assert client.get(f"/t/{normal}").text.count('class="msg role-assistant"') > 2


def test_payloads_are_escaped(client):
    for url in ("/", f"/t/{XSS_ID}", "/g/xss-group", "/runs", "/?where=" + "id = '<script>'"):
        page = client.get(url).text
        _no_raw_payload(page)
    page = client.get(f"/t/{XSS_ID}").text
    assert "&lt;script&gt;window.__omrl_xss = 1; alert(1)&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=" in page


def test_group_page(client, store):
    gid = store.sql("SELECT group_id FROM groups WHERE std_reward > 0 LIMIT 1").column(0)[0].as_py()
    rows = store.sql(f"SELECT reward FROM trajectories WHERE group_id = '{gid}' ORDER BY sample").column(0).to_pylist()
    page = client.get(f"/g/{gid}").text
    assert page.count('class="sample ') == len(rows)
    mean = sum(rows) / len(rows)
    std = (sum((r - mean) ** 2 for r in rows) / (len(rows) - 1)) ** 0.5
    shown = [float(a) for a in re.findall(r'class="num advantage">([-0-9.e]+)<', page)]
    assert shown == pytest.approx([(r - mean) / (std + 1e-4) for r in rows], abs=1e-3)
    xss = client.get("/g/xss-group").text
    assert xss.count('class="sample ') == 2 and f'href="/t/{CHILD_ID}"' in xss
    assert client.get("/g/nope").status_code == 404


def test_runs_page(client):
    page = client.get("/runs").text
    assert 'id="chart-env"' in page and "<rect" in page and 'id="rounds"' in page
    assert "judge" in page


def test_runs_page_charts_success_and_reward_per_grpo_step(client, store):
    page = client.get("/runs").text
    for chart in ("chart-step-success", "chart-step-reward"):
        svg = re.search(f'<svg class="chart lines" id="{chart}".*?</svg>', page, re.S).group(0)
        assert re.findall(r'data-points="(\d+)"', svg) == ["4"]  # one line (one run and round), 4 steps
    # the legend's last value: the success rate of the rollouts of grpo_step 3 (trained on at step 4)
    rows = [r for r in store.read().to_pylist() if json.loads(r["metadata"]).get("grpo_step") == 3]
    known = [r for r in rows if r["success"] is not None and not is_failed(r["status"])]
    rate = sum(r["success"] for r in known) / len(known)
    svg = re.search(r'id="chart-step-success".*?</svg>', page, re.S).group(0)
    assert f"last {rate:.3g}" in html.unescape(svg)


def test_runs_page_shows_judge_vs_environment_agreement(tmp_path):
    from omrl.report import judge_agreement

    store = Store.create(tmp_path / "agree")
    rows = list(synthetic_trajectories(12, seed=3))
    store.append(rows)
    # a judge that follows the reward, and one that inverts it (flagged)
    store.append([Annotation(trajectory_id=r["id"], annotator=name, score=s).to_row()
                  for r in rows if r["reward"] is not None
                  for name, s in (("follows", r["reward"]), ("inverts <b>", -r["reward"]))], table="annotations")
    expected = {(a["annotator"], a["flag"] != "") for a in judge_agreement(store)}
    assert expected == {("follows", False), ("inverts <b>", True)}
    with TestClient(make_app(store), base_url="http://127.0.0.1") as c:
        page = c.get("/runs").text
    table = re.search(r'<table class="list" id="agreement">.*?</table>', page, re.S).group(0)
    assert table.count('class="flagged"') == 1 and "inverts &lt;b&gt;" in table and "follows" in table
    assert "low (r &lt; 0.3)" in table


def test_runs_page_shows_agreement_per_grpo_step(tmp_path):
    """Per training step: the table of omrl.report.step_agreement (same rows, same flags) and a chart of r
    per step; a judge that inverts the reward at the last step is flagged there only."""
    from omrl.report import step_agreement

    store = Store.create(tmp_path / "steps")
    rows = list(synthetic_trajectories(48, seed=4))
    for i, row in enumerate(rows):
        row.update(reward=(i * 5 % 12) / 11, run_id=f"g/round-0/step-{i % 4}",
                   metadata=json.dumps({"grpo_step": i % 4, "grpo_round": 0}))
    store.append(rows)
    store.append([Annotation(trajectory_id=r["id"], annotator="judge <i>",
                             score=r["reward"] if i % 4 < 3 else 1 - r["reward"]).to_row()
                  for i, r in enumerate(rows)], table="annotations")
    expected = step_agreement(store)
    assert [(r["step"], bool(r["flag"])) for r in expected] == [(1, False), (2, False), (3, False), (4, True)]
    with TestClient(make_app(store), base_url="http://127.0.0.1") as c:
        page = c.get("/runs").text
    table = re.search(r'<table class="list" id="step-agreement">.*?</table>', page, re.S).group(0)
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", tr) for tr in re.findall(r"<tr[^>]*>(.*?)</tr>", table, re.S)[1:]]
    assert [(c[0], c[1], c[4], c[5], c[6]) for c in cells] == [
        ("judge &lt;i&gt;", "g/round-0", str(r["step"]), str(r["n"]), f"{r['pearson']:.3g}") for r in expected]
    assert table.count('class="flagged"') == 1 and "since the previous step" in cells[3][10]
    assert "1 of 4 steps flagged" in page
    svg = re.search(r'id="chart-step-agreement".*?</svg>', page, re.S).group(0)
    assert re.findall(r'data-points="(\d+)"', svg) == ["4"]
    assert re.search(r'<line class="guide"[^>]*></line><text[^>]*>0\.3</text>', svg)  # the flag threshold


def test_runs_page_without_steps_has_no_step_charts(tmp_path):
    plain = Store.create(tmp_path / "plain")
    plain.append(list(synthetic_trajectories(5, seed=2)))
    with TestClient(make_app(plain), base_url="http://127.0.0.1") as c:
        page = c.get("/runs").text
    assert 'id="chart-env"' in page and "chart-step-success" not in page and 'id="agreement"' not in page
    assert 'id="step-agreement"' not in page


def test_text_search_filters_the_list(client, store):
    """The search box narrows the list to trajectories with a message matching omrl.store.search's query, with
    the WHERE, sorted and paged like any list; a refused query is shown beside the box."""
    search = pytest.importorskip("omrl.store.search", reason="the store's text search (omrl/store/search.py) is absent")

    def hits(query):
        return set(search.search(store, query).column("trajectory_id").to_pylist())

    assert 'id="search" name="q"' in client.get("/").text
    page = client.get("/?q=evil").text
    assert sorted(_trajectory_links(page)) == sorted(f"/t/{i}" for i in hits("evil")) == [f"/t/{CHILD_ID}",
                                                                                            f"/t/{XSS_ID}"]
    assert "2 trajectories" in page and 'value="evil"' in page
    both = client.get("/", params={"q": "evil", "where": "success"}).text
    assert _trajectory_links(both) == [f"/t/{CHILD_ID}"]  # the child is the one that succeeded
    # a common word: every hit, in the SQL's order for that sort, paged with the search kept in the links
    common = hits("function")
    ordered = [r["id"] for r in store.sql("SELECT id FROM trajectories ORDER BY reward ASC NULLS LAST, id")
               .to_pylist() if r["id"] in common]
    assert 20 < len(ordered) < 62
    first = client.get("/", params={"q": "function", "sort": "reward", "dir": "asc", "per_page": 20}).text
    assert f"{len(ordered)} trajectories" in first
    assert _trajectory_links(first) == [f"/t/{i}" for i in ordered[:20]]
    assert re.search(r'rel="next" href="[^"]*q=function[^"]*page=2', html.unescape(first))
    second = client.get("/", params={"q": "function", "sort": "reward", "dir": "asc", "per_page": 20,
                                     "page": 2}).text
    assert _trajectory_links(second) == [f"/t/{i}" for i in ordered[20:40]]
    assert "0 trajectories" in client.get("/?q=zzqqxxnothere").text
    bad = client.get("/", params={"q": '"unclosed'})
    assert bad.status_code == 400 and 'id="search-error"' in bad.text and "unclosed quote" in bad.text


def test_host_header_checked(store):
    with TestClient(make_app(store), base_url="http://evil.example") as c:
        assert c.get("/").status_code == 400


def test_read_only(client):
    assert client.post("/").status_code == 405


def test_export(store, tmp_path):
    out = tmp_path / "site"
    where = "env = 'math' OR id LIKE 'xss%'"
    n = store.sql(f"SELECT count(*) FROM trajectories WHERE {where}").column(0)[0].as_py()
    done = export_site(store, out, where=where, limit=100)
    assert done.trajectories == n and (out / "index.html").is_file()
    index = (out / "index.html").read_text()
    links = _trajectory_links(index)
    assert len(links) == n and all(link.startswith("t/") and link.endswith(".html") for link in links)
    for link in links:
        assert (out / link).is_file()
    assert (out / "runs.html").is_file() and (out / "static" / "view.js").is_file()
    child = (out / "t" / f"{file_key(CHILD_ID)}.html").read_text()
    assert f'href="../t/{file_key(XSS_ID)}.html"' in child and 'href="../static/view.css"' in child
    assert f'href="../g/{file_key("xss-group")}.html"' in child
    _no_raw_payload(child)
    for page in out.rglob("*.html"):
        assert "http://" not in page.read_text() and "https://" not in page.read_text()


def test_export_pages_the_list(store, tmp_path):
    """The exported list is split into files of per_page rows linked first/prev/next/last; together they
    hold every selected trajectory once, newest first; a smaller re-export leaves no stale page behind."""
    out = tmp_path / "site"
    ordered = store.sql("SELECT id FROM trajectories ORDER BY created_at DESC NULLS LAST, id").column(0).to_pylist()
    done = export_site(store, out, limit=23, per_page=5)
    assert done.trajectories == 23 and done.pages == 5
    names = ["index.html"] + [f"page-{n}.html" for n in range(2, 6)]
    assert sorted(p.name for p in out.glob("*.html") if p.name != "runs.html") == sorted(names)
    seen = []
    for number, name in enumerate(names, start=1):
        page = (out / name).read_text()
        links = _trajectory_links(page)
        assert len(links) == (5 if number < 5 else 3)
        seen += links
        assert f"page {number} of 5" in page
        nav = re.search(r'<nav class="pager">(.*?)</nav>', page, re.S).group(1)
        assert re.findall(r'rel="next" href="([^"]+)"', nav) == names[number:number + 1]
        assert re.findall(r'rel="prev" href="([^"]+)"', nav) == ([names[number - 2]] if number > 1 else [])
    assert seen == [f"t/{file_key(i)}.html" for i in ordered[:23]]
    with pytest.raises(OmrlError, match="is not empty; give a new or empty folder, or --overwrite"):
        export_site(store, out, limit=4, per_page=5)
    again = export_site(store, out, limit=4, per_page=5, overwrite=True)
    assert again.pages == 1 and not list(out.glob("page-*.html"))
    assert len(list((out / "t").glob("*.html"))) == 4  # replaced whole: no stale trajectory page either
    assert '<nav class="pager">' not in (out / "index.html").read_text()
    with pytest.raises(OmrlError, match="per-page"):
        export_site(store, out, per_page=0)


def _live_list(client, **params) -> list[str]:
    """Trajectory ids of the served list for these params, every page walked (default order)."""
    ids, number = [], 1
    while True:
        page = client.get("/", params=dict(params, per_page=7, page=number)).text
        ids += [link.removeprefix("/t/") for link in _trajectory_links(page)]
        if 'rel="next"' not in page:
            return ids
        number += 1


def _exported_list(out: Path) -> list[str]:
    """Trajectory file keys of an export's list, index.html then page-2.html, ... in order."""
    keys, name = [], "index.html"
    while name:
        page = (out / name).read_text()
        keys += [link.removeprefix("t/").removesuffix(".html") for link in _trajectory_links(page)]
        nxt = re.findall(r'rel="next" href="([^"]+)"', page)
        name = nxt[0] if nxt else None
    return keys


@pytest.mark.parametrize("where", ["", "success", "env = 'math' OR id LIKE 'xss%'"])
def test_export_with_search_is_the_live_list(client, store, tmp_path, where):
    """`--export --search TEXT [--where SQL]` writes exactly the list the viewer shows for the same search
    and WHERE, in its order; the row cap keeps the first rows of that list and says how many matched."""
    pytest.importorskip("omrl.store.search", reason="the store's text search (omrl/store/search.py) is absent")
    live = _live_list(client, q="function", where=where)
    everything = _live_list(client)
    assert 0 < len(live) < len(everything)  # the search narrows (and the WHERE further)
    done = export_site(store, tmp_path / "site", where=where, search="function", per_page=4)
    assert done.trajectories == done.matched == len(live)
    assert _exported_list(tmp_path / "site") == [file_key(i) for i in live]
    assert sorted(p.stem for p in (tmp_path / "site" / "t").glob("*.html")) == sorted(file_key(i) for i in live)
    index = (tmp_path / "site" / "index.html").read_text()
    assert 'id="export-search"' in index and "function" in index
    cut = export_site(store, tmp_path / "cut", where=where, search="function", limit=3, per_page=2)
    assert (cut.trajectories, cut.matched, cut.pages) == (3, len(live), 2)
    assert _exported_list(tmp_path / "cut") == [file_key(i) for i in live[:3]]
    assert f"the first 3 of {len(live)} matching" in (tmp_path / "cut" / "index.html").read_text()


def test_export_search_errors_name_the_option(store, tmp_path):
    pytest.importorskip("omrl.store.search", reason="the store's text search (omrl/store/search.py) is absent")
    with pytest.raises(OmrlError, match="--search: .*unclosed quote"):
        export_site(store, tmp_path / "a", search='"unclosed')
    with pytest.raises(OmrlError, match="--where: .*does not parse"):
        export_site(store, tmp_path / "b", search="function", where="reward >")
    none = export_site(store, tmp_path / "c", search="zzqqxxnothere")
    assert (none.trajectories, none.pages) == (0, 1) and "0 trajectories" in (tmp_path / "c" / "index.html").read_text()


def test_cli_export_and_help(store, tmp_path):
    result = CliRunner().invoke(cli, ["view", str(store.path), "--export", str(tmp_path / "s"), "--where",
                                      "success", "--limit", "5"])
    assert result.exit_code == 0, result.output
    successes = store.sql("SELECT count(*) FROM trajectories WHERE success").column(0)[0].as_py()
    assert "wrote 5 trajectories" in result.output
    assert f"(1 list page; {successes} matched, --limit kept the newest)" in result.output
    paged = CliRunner().invoke(cli, ["view", str(store.path), "--export", str(tmp_path / "p"), "--limit", "7",
                                     "--per-page", "3"])
    assert paged.exit_code == 0 and "(3 list pages; 62 matched" in paged.output, paged.output
    assert (tmp_path / "p" / "page-3.html").is_file()
    serving = CliRunner().invoke(cli, ["view", str(store.path), "--per-page", "3"])
    assert serving.exit_code != 0 and "--per-page sets the pages --export writes" in serving.output
    served = CliRunner().invoke(cli, ["view", str(store.path), "--search", "evil"])
    assert served.exit_code != 0 and "--search selects what --export writes" in served.output
    searched = CliRunner().invoke(cli, ["view", str(store.path), "--export", str(tmp_path / "q"), "--search",
                                        "evil", "--limit", "1"])
    assert searched.exit_code == 0, searched.output
    assert "wrote 1 trajectories" in searched.output and "2 matched, --limit kept the newest" in searched.output
    assert len(list((tmp_path / "s" / "t").glob("*.html"))) == 5
    bad = CliRunner().invoke(cli, ["view", str(store.path), "--export", str(tmp_path / "b"), "--where", "x >"])
    assert bad.exit_code != 0 and "does not parse" in bad.output
    assert "Example" in CliRunner().invoke(cli, ["view", "--help"]).output


@pytest.mark.parametrize("url", ["/?sort=turns&dir=desc&page=2", "/?sort=tokens&dir=asc", "/?sort=success",
                                 "/?sort=model&dir=asc", "/?page=999", f"/t/{XSS_ID}", f"/t/{CHILD_ID}", "/g/xss-group",
                                 "/?q=function&sort=reward&dir=asc&per_page=7&page=2", "/?q=function&sort=turns"])
def test_duckdb_path_matches_cached_path(client, store, monkeypatch, url):
    """Above CACHE_MAX_ROWS every page is a DuckDB query; it must show exactly what the cache shows."""
    import omrl.view.data as data

    monkeypatch.setattr(data, "CACHE_MAX_ROWS", 0)
    with TestClient(make_app(store), base_url="http://127.0.0.1") as plain:
        assert plain.get(url).text == client.get(url).text


def test_new_parts_and_compaction_are_seen(tmp_path):
    store = build_store(tmp_path / "store", n=8)
    with TestClient(make_app(store), base_url="http://127.0.0.1") as c:
        assert "10 trajectories" in c.get("/").text
        assert c.get(f"/t/{XSS_ID}").status_code == 200
        extra = list(synthetic_trajectories(12, seed=2))[8:]
        for row in extra:
            row["id"] = "new-" + row["id"]
        store.append(extra)
        assert "14 trajectories" in c.get("/").text
        assert store.compact() is not None  # the parts the index points into are gone
        assert c.get(f"/t/{XSS_ID}").status_code == 200
        assert c.get(f"/t/{extra[0]['id']}").status_code == 200
        assert "14 trajectories" in c.get("/").text


def test_trajectory_page_reads_one_row_group_and_no_sql(tmp_path, monkeypatch):
    """Once the indexes exist, a trajectory page runs no query (no scan of trajectories or annotations):
    it decodes the one row group holding the row and finds annotations and children by index; annotations
    written later show up (new parts: new index)."""
    import omrl.view.data as data
    from omrl.view.rows import RowGroups

    store = build_store(tmp_path / "store", n=30)
    with TestClient(make_app(store), base_url="http://127.0.0.1") as c:
        assert c.get("/").status_code == 200 and c.get(f"/t/{CHILD_ID}").status_code == 200  # indexes built
        reads = []
        real = RowGroups._group

        def spy(self, part, rg, columns):
            hit = (part, rg, columns) in self._cache
            reads.append((self.table, hit))
            return real(self, part, rg, columns)

        def no_sql(*args, **kwargs):
            raise AssertionError("a trajectory page ran a query")

        monkeypatch.setattr(RowGroups, "_group", spy)
        for name in ("run_query", "select_where"):
            monkeypatch.setattr(data, name, no_sql)
        monkeypatch.setattr(data.StoreReader, "sql", no_sql)
        page = c.get(f"/t/{XSS_ID}").text
        assert "The agent wrote" in page and "metric crashed" in page  # both annotations
        assert f'class="child-link" href="/t/{CHILD_ID}"' in page
        assert [table for table, _ in reads] == ["trajectories", "annotations"]
        monkeypatch.undo()
        store.append([Annotation(trajectory_id=XSS_ID, annotator="later", score=1.0,
                                 rationale="written after the viewer opened").to_row()], table="annotations")
        page = c.get(f"/t/{XSS_ID}").text
        assert "written after the viewer opened" in page and "annotations (3)" in page


def test_diff_page(client, store):
    page = client.get("/diff", params={"a": XSS_ID, "b": CHILD_ID})
    assert page.status_code == 200
    assert 'id="diff"' in page.text and "identical message" in page.text  # same thread: one equal run
    _no_raw_payload(page.text)
    child = client.get(f"/t/{CHILD_ID}").text
    assert 'class="diff-link" href="/diff?a=xss-trajectory&amp;b=xss-child"' in child
    a, b = store.sql("SELECT id FROM trajectories WHERE env = 'math' ORDER BY id LIMIT 2").column(0).to_pylist()
    other = client.get("/diff", params={"a": a, "b": b}).text
    assert 'class="replace"' in other or 'class="insert"' in other or 'class="delete"' in other
    assert '<tr class="changed">' in other  # task or sample differ
    assert client.get("/diff", params={"a": a, "b": "nope"}).status_code == 404
    group = client.get("/g/xss-group").text
    assert 'class="diff-link" href="/diff?a=xss-child&amp;b=xss-trajectory"' in group


def test_cli_serves(store):
    """`omrl view STORE --port P` serves the viewer on 127.0.0.1 until stopped."""
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "omrl", "view", str(store.path), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/runs", timeout=5) as response:
                    assert response.status == 200 and b'id="rounds"' in response.read()
                    assert "script-src 'self'" in response.headers["Content-Security-Policy"]
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(proc.stdout.read().decode() if proc.poll() is not None
                                         else "no answer") from None
                time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_sparse_rows_and_empty_store(tmp_path):
    """Rows with only the required fields, arguments that are not JSON, and an empty store all render."""
    empty = Store.create(tmp_path / "empty")
    with TestClient(make_app(empty), base_url="http://127.0.0.1") as c:
        assert "0 trajectories" in c.get("/").text
        assert c.get("/runs").status_code == 200
        assert "0 trajectories" in c.get("/", params={"where": "success"}).text
    store = Store.create(tmp_path / "sparse")
    store.append([{"id": "bare", "task_id": "t"},
                  {"id": "bare2", "task_id": "t2", "reward": None, "messages": [
                      {"role": "assistant", "content": None,
                       "tool_calls": [{"id": None, "name": "f", "arguments": "not json {"}]}]}])
    with TestClient(make_app(store), base_url="http://127.0.0.1") as c:
        for url in ("/", "/t/bare", "/runs", "/?sort=reward", "/diff?a=bare&b=bare2"):
            assert c.get(url).status_code == 200, url
        assert "not json {" in c.get("/t/bare2").text
        gid = store.sql("SELECT group_id FROM trajectories WHERE id = 'bare2'").column(0)[0].as_py()
        assert "advantage" in c.get(f"/g/{gid}").text
    assert export_site(store, tmp_path / "site").trajectories == 2


# ------------------------------------------------------------- other sites, slow queries, long texts


@pytest.mark.parametrize("headers", [{"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"},
                                     {"Origin": "http://evil.example"}, {"Origin": "null"},
                                     {"Sec-Fetch-Site": "cross-site", "Origin": "http://127.0.0.1"}])
def test_requests_from_other_sites_are_refused(client, headers):
    """Any web page can point an <img> or a form at 127.0.0.1: what it makes the browser ask is refused."""
    for url in ("/", f"/t/{XSS_ID}", "/runs", "/static/view.js", "/?where=success"):
        response = client.get(url, headers=headers)
        assert response.status_code == 403, (url, headers)
        assert "another site" in response.text and "content-security-policy" in response.headers


def test_the_viewers_own_requests_pass(client):
    own = {"Sec-Fetch-Site": "same-origin", "Origin": "http://127.0.0.1"}
    for headers in (own, {"Sec-Fetch-Site": "none"}, {"Sec-Fetch-Site": "same-origin"}, {}):
        for url in ("/", f"/t/{XSS_ID}", "/static/view.css"):
            assert client.get(url, headers=headers).status_code == 200, (url, headers)


def test_a_pages_queries_stop_at_the_viewers_time_limit(store):
    from tests.cases.escapes import SLOW_WHERE

    with TestClient(make_app(store, timeout=1.0), base_url="http://127.0.0.1") as c:
        response = c.get("/", params={"where": SLOW_WHERE})
        assert response.status_code == 400
        assert "ran past the viewer's time limit of 1 s" in html.unescape(response.text)
        assert c.get("/", params={"where": "success"}).status_code == 200  # the connection is usable after


def test_a_where_past_the_viewers_memory_cap_is_refused(store):
    from omrl.store.query import QueryLimits

    hog = "(SELECT length(string_agg(repeat('x', 100000), '')) FROM messages a, messages b) > 0"  # ~2 GB
    with TestClient(make_app(store, limits=QueryLimits(256, 2)), base_url="http://127.0.0.1") as c:
        response = c.get("/", params={"where": hog})
        assert response.status_code == 400 and "more memory than its cap" in response.text
        assert c.get(f"/t/{XSS_ID}").status_code == 200


@pytest.fixture(scope="module")
def big_store(tmp_path_factory) -> Store:
    """Two rows: one with a 3 MB tool message ending in a script tag (past any cut), 3 MB reasoning and a
    3 MB tool call argument, and a small one."""
    store = Store.create(tmp_path_factory.mktemp("view-big") / "store")
    rows = list(synthetic_trajectories(2, seed=5))
    text = "word " * (600_000) + XSS_SCRIPT
    rows[0].update(id="big", messages=[
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "ok", "reasoning": "r" * 3_000_000,
         "tool_calls": [{"id": "c0", "name": "f", "arguments": json.dumps({"x": "a" * 3_000_000})}]},
        {"role": "tool", "tool_call_id": "c0", "content": text}])
    store.append(rows)
    return store


def test_a_long_message_is_cut_with_a_link_to_its_whole_text(big_store):
    from omrl.view.pages import CUT_CHARS

    with TestClient(make_app(big_store), base_url="http://127.0.0.1") as c:
        page = c.get("/t/big")
        assert page.status_code == 200 and len(page.content) < 20 * CUT_CHARS  # not 9 MB
        _no_raw_payload(page.text)
        links = [html.unescape(h) for h in re.findall(r'class="full-text" href="([^"]+)"', page.text)]
        assert links == ["/full/big?field=reasoning&at=1", "/full/big?field=arguments&at=1&call=0",
                         "/full/big?field=content&at=2"]
        whole = c.get(links[2])
        assert whole.status_code == 200 and len(whole.content) > 3_000_000
        assert html.escape(XSS_SCRIPT) in whole.text and "<script>window" not in whole.text
        assert 'class="back-link" href="/t/big#m2"' in whole.text
        assert c.get(links[1]).text.count("a") > 3_000_000
        for bad in ("/full/big?field=content&at=9", "/full/big?field=password", "/full/nope?field=content&at=0",
                    "/full/big?field=content&at=x"):
            assert c.get(bad).status_code == 404, bad
        other = big_store.sql("SELECT id FROM trajectories WHERE id <> 'big'").column(0)[0].as_py()
        small = c.get(f"/t/{other}")
        assert small.status_code == 200 and 'class="full-text"' not in small.text


def test_the_export_cuts_long_texts_and_writes_their_whole_pages(big_store, tmp_path):
    from omrl.view.pages import full_text_key

    export_site(big_store, tmp_path / "site")
    page = (tmp_path / "site" / "t" / f"{file_key('big')}.html").read_text()
    assert len(page) < 1_000_000
    whole = tmp_path / "site" / "t" / f"{full_text_key('big', 'content', 2)}.html"
    assert f'href="../t/{whole.name}"' in page
    text = whole.read_text()
    assert html.escape(XSS_SCRIPT) in text and f'href="../t/{file_key("big")}.html#m2"' in text


def test_an_export_never_writes_into_a_store_or_over_a_folder(store, tmp_path):
    before = {p: p.read_bytes() for p in store.path.rglob("*") if p.is_file()}
    for target, overwrite in [(store.path, False), (store.path, True), (store.path / "data", True),
                              (store.path / "site", False), (store.path.parent, True)]:
        with pytest.raises(OmrlError, match="store"):
            export_site(store, target, limit=2, overwrite=overwrite)
    assert {p: p.read_bytes() for p in store.path.rglob("*") if p.is_file()} == before
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    result = CliRunner().invoke(cli, ["view", str(store.path), "--export", str(mine), "--limit", "2"])
    assert result.exit_code == 1 and "is not empty" in result.output and "--overwrite" in result.output
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    replaced = CliRunner().invoke(cli, ["view", str(store.path), "--export", str(mine), "--limit", "2",
                                        "--overwrite"])
    assert replaced.exit_code == 0, replaced.output
    assert (mine / "index.html").is_file() and not (mine / "notes.txt").exists()
    assert CliRunner().invoke(cli, ["view", str(store.path), "--overwrite"]).exit_code == 2
    assert CliRunner().invoke(cli, ["view", str(store.path), "--timeout", "inf"]).exit_code == 2


def test_the_viewer_suite_finds_no_escape(tmp_path):
    """tests.cases.escapes' viewer cases over HTTP: other sites refused, a slow WHERE stopped and holding
    up no other page, the memory cap, a big message, exports into stores (benchmarks/chaos.py runs it at
    full size, with the 2 s target). Here the slow WHERE runs 8 s and another page may wait 4 s more than
    without it (one lock made them wait all 8 s): a busy CI machine slows every page."""
    from tests.cases.escapes import run_viewer_escapes

    report = run_viewer_escapes(tmp_path, timeout_s=8.0, allowed_s=4.0, big_mb=4)
    assert report.cases >= 20 and report.escapes == 0, report.details
    assert report.details == [], report.details
    assert report.figures["big_message_page_kb"] < 1024


def test_runs_page_groups_a_study_seed_store_by_method(tmp_path):
    """A study's seed store (omrl study run's run names): a row per method and run with its training and dev/test
    success, each run's link filtering the list to its episodes; a store without study runs has no such table."""
    from urllib.parse import parse_qs, urlparse

    rows = list(synthetic_trajectories(48, seed=5))
    names = ["grpo-lr0.0001-max_steps2/round-1/step-00000", "grpo-lr0.0001-max_steps2/round-1/step-00001",
             "eval-dev-grpo-lr0.0001-max_steps2-greedy_t0", "eval-test-grpo-lr0.0001-max_steps2-sampled_t1",
             "eval-test-sft-greedy_t0", "eval-base-greedy_t0", "demos", "more_sft-lr0.003-max_steps2"]
    for i, row in enumerate(rows):
        row.update(run_id=names[i % len(names)], status="ok", success=bool(i % 3), round=0)
    folder = tmp_path / "study" / "conditions" / "gold-0123456789ab" / "seed-2" / "store"
    store = Store.create(folder)
    store.append(rows)

    def rate(run_id):
        picked = [r["success"] for r in rows if r["run_id"] == run_id]
        return sum(picked) / len(picked)

    with TestClient(make_app(store), base_url="http://127.0.0.1") as c:
        page = html.unescape(c.get("/runs").text)
        table = re.search(r'<table class="list" id="study-runs">.*?</table>', page, re.S).group(0)
        assert "per method (seed 2)" in page
        cells = {m.group(1): re.findall(r"<td[^>]*>(.*?)</td>", m.group(0))
                 for m in re.finditer(r"<tr><td>(\w+)</td>.*?</tr>", table)}
        assert set(cells) == {"grpo", "sft", "more_sft"}  # the expert's demos and iterate's own evals left out
        train = (sum(r["success"] for r in rows if r["run_id"].startswith("grpo-lr0.0001-max_steps2/"))
                 / sum(r["run_id"].startswith("grpo-lr0.0001-max_steps2/") for r in rows))
        grpo = cells["grpo"]
        assert grpo[2] == "12" and grpo[3] == fmt(train)  # 2 steps x 6 episodes
        assert grpo[5] == fmt(rate('eval-dev-grpo-lr0.0001-max_steps2-greedy_t0')) and grpo[4] == fmt(None)
        assert grpo[6] == fmt(rate('eval-test-grpo-lr0.0001-max_steps2-sampled_t1'))
        assert cells["sft"][7] == fmt(rate('eval-test-sft-greedy_t0'))
        link = re.search(r'href="([^"]+)">grpo-lr0.0001-max_steps2<', page).group(1)
        where = parse_qs(urlparse(link).query)["where"][0]
        listed = c.get("/", params={"where": where, "per_page": 100}).text
        assert listed.count("eval-test-grpo-lr0.0001") >= 1 and "eval-test-sft-greedy_t0" not in listed
        assert 'id="study-seeds"' not in page  # the condition's test set is not scored yet: no study.json
    # once it is, every seed of the condition side by side, from the study's study.json
    figure = {"per_seed": {"0": 0.5, "1": 0.25, "2": 0.75}, "mean": 0.5, "half_width": 0.62}
    study = {"study": "coin", "primary": {"metric": "greedy"}, "seeds": 3, "conditions": {"gold": {"methods": {
        "grpo": {"kind": "grpo", "test": {"greedy": figure}, "dev": {"greedy": {"mean": 0.4}}},
        "sft": {"kind": "sft", "test": {}, "dev": {}}}}}}
    (tmp_path / "study" / "study.json").write_text(json.dumps(study))
    with TestClient(make_app(store), base_url="http://127.0.0.1") as c:
        page = html.unescape(c.get("/runs").text)
    assert "every seed (coin, condition gold, test greedy)" in page
    seeds = re.search(r'<table class="list" id="study-seeds">.*?</table>', page, re.S).group(0)
    cells = {m.group(1): re.findall(r'<td class="num">(.*?)</td>', m.group(0))
             for m in re.finditer(r"<tr><td>(\w+)</td>.*?</tr>", seeds)}
    assert cells["grpo"] == [fmt(0.5), fmt(0.25), fmt(0.75), fmt(0.5), fmt(0.62), fmt(0.4)]
    assert cells["sft"] == [fmt(None)] * 6  # no figure is shown as none, not as 0
    (tmp_path / "study" / "study.json").write_text("{not json")
    with TestClient(make_app(store), base_url="http://127.0.0.1") as c:
        assert "study.json: JSONDecodeError" in c.get("/runs").text  # said, not hidden
        (tmp_path / "study" / "study.json").write_text(json.dumps({**study, "seeds": 10**9}))
        assert "seeds 1000000000 is not between 1 and 1000" in c.get("/runs").text
    plain = Store.create(tmp_path / "plain")
    plain.append(list(synthetic_trajectories(6, seed=1)))
    with TestClient(make_app(plain), base_url="http://127.0.0.1") as c:
        plain_page = c.get("/runs").text
        assert 'id="study-runs"' not in plain_page and 'id="study-seeds"' not in plain_page
