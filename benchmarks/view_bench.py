"""`omrl view` speed: median time to serve one list page and one trajectory page on a big store.

Builds a store of --n synthetic trajectories (omrl.synthetic; 100,000 by default, which takes minutes to
write: --store DIR keeps it for the next run), then serves pages through Starlette's TestClient (the
whole app: routing, DuckDB, templates) and prints one JSON line:
{"n": ..., "list_page_ms": median, "trajectory_page_ms": median, ...}. Targets: list <= 200 ms,
trajectory <= 100 ms.

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
from omrl.synthetic import synthetic_trajectories


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
            sorts = ["reward", "created_at", "task_id", "tokens", "num_turns"]
            pages = max(1, args.n // 50)
            list_urls = [f"/?sort={rng.choice(sorts)}&dir={rng.choice(['asc', 'desc'])}"
                         f"&page={rng.randint(1, pages)}" for _ in range(args.repeat)]
            where_urls = [f"/?where=reward+%3E+0.5+AND+num_turns+%3E+{rng.randint(1, 9)}"
                          f"&page={rng.randint(1, 20)}" for _ in range(args.repeat)]
            trajectory_urls = [f"/t/{rng.choice(ids)}" for _ in range(args.repeat)]
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
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
