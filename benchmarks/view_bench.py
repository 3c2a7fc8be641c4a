"""`omrl view` speed: median time to serve one list page and one trajectory page on a big store.

Builds a store of --n synthetic trajectories (omrl.testing.synthetic; 100,000 by default, which takes minutes to
write: --store DIR keeps it for the next run), then serves pages through Starlette's TestClient (the
whole app: routing, DuckDB, templates) and prints one JSON line:
{"n": ..., "list_page_ms": median, "trajectory_page_ms": median, ...}. Targets: list <= 200 ms,
trajectory <= 100 ms.

Baselines measured in the same run, on one confined DuckDB connection (omrl.store.query.connect) with no app
around it: the same list page as one ORDER BY ... LIMIT/OFFSET query (`list_vs_sql` = page / query) and the
same trajectory as `SELECT * ... WHERE id = ?` (`trajectory_vs_sql`). With omrl.store.search present, the list
filtered by a text search (a rare phrase, the most common word, new phrases) against the search call
alone (`search_page_vs_call`); the parts' search indexes are built first (`search_index_s`).

    python benchmarks/view_bench.py --n 100000 --store /tmp/view-100k
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from omrl.store import Store
from omrl.testing.synthetic import synthetic_trajectories


def build(path: Path, n: int, batch: int = 5000) -> Store:
    """A store of `n` synthetic trajectories at `path` (reused when it already holds `n` rows)."""
    store = Store.create(path)
    have = store.count()
    if have == n:
        return store
    if have:
        raise SystemExit(f"{path} holds {have} trajectories, not {n}; give another --store")
    rows = synthetic_trajectories(n, seed=0)
    done = 0
    while done < n:
        chunk = [next(rows) for _ in range(min(batch, n - done))]
        store.append(chunk)
        done += len(chunk)
        print(f"written {done}/{n}", file=sys.stderr, flush=True)
    return store


def _median_ms(client, urls: list[str]) -> float:
    times = []
    for url in urls:
        start = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - start) * 1000)
        if response.status_code != 200:
            raise SystemExit(f"GET {url} answered {response.status_code}")
    return round(statistics.median(times), 1)


def _median_call_ms(work, args: list) -> float:
    times = []
    for arg in args:
        start = time.perf_counter()
        work(arg)
        times.append((time.perf_counter() - start) * 1000)
    return round(statistics.median(times), 1)


def _sql_baselines(store: Store, list_pages: list[tuple[str, bool, int]], ids: list[str]) -> dict[str, float]:
    """The list and trajectory pages' data as plain queries on one confined connection (no app, no cache)."""
    from omrl.store.query import close, connect, quote_literal, run_query
    from omrl.view.data import LIST_COLUMNS, PER_PAGE, SORTS

    con = connect(store)
    try:
        def page(spec):
            sort, desc, number = spec
            run_query(store, f"SELECT {LIST_COLUMNS} FROM trajectories ORDER BY {SORTS[sort]} "
                             f"{'DESC' if desc else 'ASC'} NULLS LAST, id LIMIT {PER_PAGE} "
                             f"OFFSET {(number - 1) * PER_PAGE}", con=con)

        def row(tid):
            run_query(store, f"SELECT * FROM trajectories WHERE id = {quote_literal(tid)}", con=con)

        page(list_pages[0])  # warm the connection's scan of the parts
        return {"list": _median_call_ms(page, list_pages), "trajectory": _median_call_ms(row, ids)}
    finally:
        close(con)


def _common_word(store: Store) -> str:
    """The token in the most messages of a sample of rows (omrl.store.search's tokens)."""
    from collections import Counter

    from omrl.store.search import tokenize

    counts: Counter = Counter()
    for row in store.sql("SELECT messages FROM trajectories USING SAMPLE 200 ROWS (reservoir, 0)").to_pylist():
        for message in row["messages"] or []:
            counts.update(set(tokenize(message.get("content") or "")))
    return counts.most_common(1)[0][0]


def _search_figures(store: Store, client, terms: list[str], repeat: int) -> dict[str, float]:
    """The list filtered by each search term (first request excluded: it fills the hit cache) and the
    search call alone."""
    from urllib.parse import urlencode

    from omrl.store import search

    start = time.perf_counter()
    built = search.build_missing(store)
    figures: dict[str, float] = {"search_index_s": round(time.perf_counter() - start, 1),
                                 "search_indexes_built": built}
    # A rare phrase (a task id) and the most common word of the messages: the list filters by
    # search.search_ids (ids from the index alone), so a word in nearly every row is no longer a full read.
    for name, term in zip(("rare", "common"), terms[:1] + [_common_word(store)], strict=True):
        call_ms = _median_call_ms(lambda q: search.search_ids(store, q), [term] * max(3, repeat // 3))
        hits = search.search_ids(store, term)
        client.get("/?" + urlencode({"q": term})).raise_for_status()
        pages = max(1, len(hits) // 50)
        urls = ["/?" + urlencode({"q": term, "sort": "reward", "page": 1 + i % pages}) for i in range(repeat)]
        figures.update({f"search_{name}_hits": len(hits), f"search_{name}_call_ms": call_ms,
                        f"search_{name}_page_ms": _median_ms(client, urls)})
    # a new query on each request (the uncached path: search + narrow + sort + page)
    fresh = [f'"{t}"' for t in terms[1:]]
    figures["search_fresh_page_ms"] = _median_ms(client, ["/?" + urlencode({"q": q}) for q in fresh])
    figures["search_fresh_call_ms"] = _median_call_ms(lambda q: search.search_ids(store, q), fresh)
    figures["search_page_vs_call"] = round(figures["search_fresh_page_ms"] / figures["search_fresh_call_ms"], 2)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="trajectories in the store")
    parser.add_argument("--store", type=Path, help="keep the store here (reused when it has --n rows)")
    parser.add_argument("--repeat", type=int, default=15, help="requests per measured page kind")
    parser.add_argument("--build-only", action="store_true", help="write the store and stop")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = args.store or Path(tmp) / "store"
        start = time.perf_counter()
        store = build(path, args.n)
        build_s = time.perf_counter() - start
        if args.build_only:
            return
        from starlette.testclient import TestClient

        from omrl.view.app import make_app

        rng = random.Random(0)
        with TestClient(make_app(store), base_url="http://127.0.0.1") as client:
            start = time.perf_counter()
            client.get("/").raise_for_status()  # the first request opens the connection
            first_ms = (time.perf_counter() - start) * 1000
            sample = store.sql("SELECT id, group_id FROM trajectories USING SAMPLE 200 ROWS").to_pylist()
            ids = [r["id"] for r in sample]
            sorts = ["reward", "created", "task", "tokens", "turns"]  # keys of omrl.view.data.SORTS
            pages = max(1, args.n // 50)
            list_pages = [(rng.choice(sorts), rng.random() < 0.5, rng.randint(1, pages))
                          for _ in range(args.repeat)]
            list_urls = [f"/?sort={sort}&dir={'desc' if desc else 'asc'}&page={number}"
                         for sort, desc, number in list_pages]
            where_urls = [f"/?where=reward+%3E+0.5+AND+num_turns+%3E+{rng.randint(1, 9)}"
                          f"&page={rng.randint(1, 20)}" for _ in range(args.repeat)]
            trajectory_ids = [rng.choice(ids) for _ in range(args.repeat)]
            trajectory_urls = [f"/t/{tid}" for tid in trajectory_ids]
            group_urls = [f"/g/{r['group_id']}" for r in sample[:5]]
            figures = {
                "n": args.n,
                "list_page_ms": _median_ms(client, list_urls),
                "trajectory_page_ms": _median_ms(client, trajectory_urls),
                "list_where_page_ms": _median_ms(client, where_urls),
                "group_page_ms": _median_ms(client, group_urls),
                "runs_page_ms": _median_ms(client, ["/runs"] * 3),
                "first_request_ms": round(first_ms, 1),
                "build_s": round(build_s, 1),
            }
            baseline = _sql_baselines(store, list_pages, trajectory_ids)
            figures.update(list_sql_ms=baseline["list"], trajectory_sql_ms=baseline["trajectory"],
                           list_vs_sql=round(figures["list_page_ms"] / baseline["list"], 2),
                           trajectory_vs_sql=round(figures["trajectory_page_ms"] / baseline["trajectory"], 2))
            from omrl.view.data import search_available

            if search_available():
                tasks = [r["task_id"] for r in store.sql(
                    "SELECT DISTINCT task_id FROM trajectories ORDER BY task_id LIMIT 6").to_pylist()]
                figures.update(_search_figures(store, client, [f'"{tasks[0]}"'] + tasks[1:], args.repeat))
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
