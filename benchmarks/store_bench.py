"""Store vs JSONL: bytes on disk, write time and four analytic queries on a realistic synthetic corpus.

Corpus: N trajectories, about 8 turns on average, a repeated 1.5 KB system prompt, tool outputs of
0.2-4 KB. Samples of one task (a GRPO group) read many of the same files, as agents in one repository do,
so each task has a pool of documents its tool calls return; the rest of the outputs are fresh text.
With --from-store, the rows of an existing store are used instead (e.g. real files imported with `omrl import`).

Prints one JSON line. Targets (issue 26, at --n 100000): size_vs_zstd3 (bytes of `zstd -3` of the same
JSONL, what a user would otherwise keep, / every byte of the store on disk, side data and search index
included) >= 1.0 (size_vs_zstd3_without_index: the same without the index); append_ratio (the appends /
writing the JSONL) <= 1.5; compact_ratio (the `compact` that merges them, without the search index / writing
the JSONL) <= 1.0; index_ratio (building the search index afterwards, timed apart / writing the JSONL)
<= 1.0; query_speedup_min (smallest plain-Python-over-JSONL time / store time over the four queries) >= 20
and query_speedup_min_duckdb_jsonl (the same against DuckDB reading the JSONL) >= 10. Also printed: size_ratio (JSONL bytes / store bytes) beside zstd_long_ratio
(`zstd -19 --long=27` of the same JSONL: the bound), write_ratio (appends + compact + index / JSONL).
Writing the JSONL (the baseline of the ratios) runs 3 times and each query 3 times; the medians count. The
store's answers must equal both baselines' by value (floats to 1e-9; word_search: the same trajectory ids;
asserted). Both writers are warmed up on one row first (imports and first-call set-up are not write speed).
trajectory_read_ms: median time to read one trajectory as the viewer does (its whole row group decoded, the
row taken), over 21 random rows.

    python benchmarks/store_bench.py --n 100000
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import math
import random
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from omrl.schema import group_id, trajectory_id
from omrl.schema.arrow import to_table
from omrl.store import Store
from omrl.store.layout import SIDE_DIR
from omrl.store.search import INDEX_SUFFIX, build_missing, search_ids

ENVS = ("code", "math", "shop", "sql", "web")
TOOLS = {
    "code": ["list_files", "read_file", "edit_file", "run_tests"],
    "math": ["calculator", "python"],
    "shop": ["search", "click", "view"],
    "sql": ["execute_sql", "describe_table"],
    "web": ["open_url", "find", "scroll"],
}
JSONL_WRITES = 3
SEARCH_WORD = "segfault"  # appears in a known share of tool outputs


def make_vocabulary(rng: random.Random, size: int = 4000) -> tuple[list[str], list[float]]:
    """Pseudo-words with Zipf frequencies, like identifiers and prose in real tool output."""
    letters = "etaoinshrdlcumwfgypbvkjxqz_"
    words = sorted({"".join(rng.choices(letters, k=rng.randint(2, 11))) for _ in range(size)})
    weights = [1 / (rank + 1) for rank in range(len(words))]
    return words, weights


class TextSource:
    """Fresh text: random slices of a large Zipf-word corpus (no two slices alike within a page)."""

    def __init__(self, rng: random.Random, megabytes: int = 24):
        words, weights = make_vocabulary(rng)
        cumulative = list(itertools.accumulate(weights))  # what choices() computes on every call: same draws
        lines = []
        size = 0
        while size < megabytes * 1_000_000:
            line = " ".join(rng.choices(words, cum_weights=cumulative, k=rng.randint(3, 14)))
            lines.append(line)
            size += len(line) + 1
        self.corpus = "\n".join(lines)
        self.rng = rng

    def text(self, n_bytes: int) -> str:
        start = self.rng.randrange(0, len(self.corpus) - n_bytes - 1)
        return self.corpus[start:start + n_bytes]


SYSTEM_PROMPT = ("You are a capable software agent working inside a sandbox. Use the tools provided to inspect "
                 "the environment, reason about what you observe, and act. Keep each tool call focused, never "
                 "invent observations, prefer small verifiable steps, and stop when the task is complete. ") * 6
SYSTEM_PROMPT = SYSTEM_PROMPT[:1500]


def make_corpus(n: int, seed: int, samples_per_task: int = 8):
    """Yield n trajectory rows (dicts) with the shape described in the module docstring."""
    rng = random.Random(seed)
    source = TextSource(rng)
    pools: dict[str, list[str]] = {}
    for index in range(n):
        task_number = index // samples_per_task
        env = ENVS[task_number % len(ENVS)]
        task_id = f"{env}-{task_number:07d}"
        sample = index % samples_per_task
        if sample == 0:
            pools = {task_id: [source.text(rng.randint(200, 4000)) for _ in range(6)]}
            instruction = source.text(rng.randint(150, 500))
        n_turns = max(1, min(40, round(rng.lognormvariate(1.9, 0.5))))
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": instruction}]
        turns = []
        for turn in range(n_turns):
            tool = rng.choice(TOOLS[env])
            call_id = f"call_{turn}"
            output = rng.choice(pools[task_id]) if rng.random() < 0.6 else source.text(rng.randint(200, 4000))
            if rng.random() < 0.02:
                output = output[: len(output) // 2] + f" {SEARCH_WORD} " + output[len(output) // 2:]
            messages.append({"role": "assistant", "content": source.text(rng.randint(40, 300)),
                             "tool_calls": [{"id": call_id, "name": tool,
                                             "arguments": json.dumps({"arg": source.text(rng.randint(10, 60))})}]})
            messages.append({"role": "tool", "tool_call_id": call_id, "name": tool, "content": output})
            turns.append({"index": turn, "reward": 0.0, "done": turn == n_turns - 1,
                          "latency_s": round(rng.uniform(0.3, 4.0), 3), "prompt_tokens": 500 + 350 * turn,
                          "completion_tokens": rng.randint(20, 150), "info": "{}"})
        success = rng.random() < 0.4
        turns[-1]["reward"] = 1.0 if success else 0.0
        run_id = "bench"
        yield {
            "id": trajectory_id(run_id, 0, task_id, sample), "run_id": run_id, "round": 0, "task_id": task_id,
            "group_id": group_id(run_id, 0, task_id), "sample": sample, "env": env, "model": "bench-policy",
            "instruction": instruction, "task": json.dumps({"answer": str(task_number)}), "tools": "[]",
            "messages": messages, "turns": turns, "reward": 1.0 if success else 0.0, "success": success,
            "status": "ok", "num_turns": n_turns,
            "prompt_tokens": sum(t["prompt_tokens"] for t in turns),
            "completion_tokens": sum(t["completion_tokens"] for t in turns),
            "duration_s": round(sum(t["latency_s"] for t in turns), 3), "source": "collected",
            "metadata": "{}", "created_at": "2026-01-01T00:00:00+00:00",
        }


# ------------------------------------------------------------------ JSONL baseline (plain Python)

def _jsonl_rows(path: Path):
    with open(path, encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)


def jsonl_success_per_env(path: Path) -> dict:
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for row in _jsonl_rows(path):
        counts[row["env"]][0] += bool(row["success"])
        counts[row["env"]][1] += 1
    return {env: ok / n for env, (ok, n) in counts.items()}


def jsonl_groups(path: Path) -> dict:
    rewards: dict[str, list[float]] = defaultdict(list)
    for row in _jsonl_rows(path):
        rewards[row["group_id"]].append(row["reward"])
    out = {}
    for g, r in rewards.items():
        known = [x for x in r if x is not None]  # imported rows may have no reward; SQL's avg skips NULL
        out[g] = (len(r), statistics.fmean(known) if known else None, statistics.pstdev(known) if known else None)
    return out


def jsonl_tool_counts(path: Path) -> Counter:
    counts: Counter = Counter()
    for row in _jsonl_rows(path):
        for message in row["messages"]:
            for call in message.get("tool_calls") or []:
                counts[call["name"]] += 1
    return counts


def jsonl_word_search(path: Path, word: str) -> list[str]:
    """The sorted ids of the trajectories with a message holding `word` as a whole word, any case
    (omrl.store.search's rule for one word)."""
    pattern = re.compile(rf"(?<!\w){re.escape(word.lower())}(?!\w)")
    return sorted(row["id"] for row in _jsonl_rows(path)
                  if any(pattern.search((m.get("content") or "").lower()) for m in row["messages"]))


STORE_QUERIES = {
    "success_per_env": "SELECT env, avg(CASE WHEN success THEN 1.0 ELSE 0.0 END) AS rate FROM trajectories GROUP BY env",
    "groups": "SELECT group_id, n, mean_reward, std_reward FROM groups",
    "tool_counts": "SELECT name, count(*) AS n FROM tool_calls GROUP BY name",
}


def duckdb_jsonl_queries(path: Path, word: str) -> dict[str, str]:
    """The same questions asked of the JSONL file by DuckDB alone (what a user without omrl has)."""
    src = f"read_json('{path}', format='newline_delimited', maximum_object_size=1073741824)"
    return {
        "success_per_env": f"SELECT env, avg(CASE WHEN success THEN 1.0 ELSE 0.0 END) AS rate FROM {src} GROUP BY env",
        "groups": f"SELECT group_id, count(*) AS n, avg(reward), stddev_pop(reward) FROM {src} GROUP BY group_id",
        "tool_counts": f"SELECT c.name AS name, count(*) AS n FROM (SELECT unnest(m.tool_calls) AS c FROM "
                       f"(SELECT unnest(messages) AS m FROM {src})) GROUP BY 1",
        "word_search": f"SELECT id FROM {src} WHERE len(list_filter(messages, lambda m: "
                       f"regexp_matches(lower(m.content), '\\b{re.escape(word.lower())}\\b'))) > 0 ORDER BY id",
    }


def timed(fn, *args, repeat: int = 3):
    """(median seconds of `repeat` runs, the last result)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def zstd_bytes(path: Path, *options: str) -> int | None:
    """Bytes of `zstd OPTIONS` of the file (None without the zstd command)."""
    if shutil.which("zstd") is None:
        return None
    with subprocess.Popen(["zstd", *options, "-q", "-c", str(path)], stdout=subprocess.PIPE) as p:
        size = sum(len(chunk) for chunk in iter(lambda: p.stdout.read(1 << 20), b""))
    return size if p.returncode == 0 else None


def zstd3_bytes(path: Path) -> int:
    """Bytes of `zstd -3` of the file (the zstd command's default level; pyarrow's zstd stream without it)."""
    size = zstd_bytes(path, "-3")
    if size is not None:
        return size
    counter = _CountingSink()
    with pa.CompressedOutputStream(pa.PythonFile(counter, mode="w"), "zstd") as out, open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            out.write(chunk)
    return counter.size


class _CountingSink:
    """A write-only file that only counts the bytes written to it."""

    size = 0
    closed = False

    def write(self, data) -> int:
        self.size += len(data)
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def _same(a, b) -> bool:
    """Equal by value, floats to 1e-9 (SQL and Python sum in other orders), through lists and tuples."""
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _by_key(table: pa.Table) -> dict:
    """A query's answer as {first column: the other columns as a tuple} (its rows in any order)."""
    columns = [table.column(i).to_pylist() for i in range(table.num_columns)]
    return {row[0]: row[1:] for row in zip(*columns, strict=True)}


def same_answers(a: dict, b: dict) -> bool:
    """Whether two answers keyed by their first column hold the same keys with the same values."""
    return a.keys() == b.keys() and all(_same(list(a[k]), list(b[k])) for k in a)


def store_rows(path: Path) -> list[dict]:
    """The trajectories of an existing store as JSON-ready rows (--from-store)."""
    table = Store(path).read()
    rows = table.to_pylist()
    for row in rows:
        row["created_at"] = row["created_at"].isoformat() if row["created_at"] else None
    return rows


def trajectory_read_ms(store: Store, n: int, samples: int = 21) -> tuple[float, int]:
    """(median ms to read one random trajectory the way the viewer does, row groups in the store)."""
    rng = random.Random(1)
    groups = [(part, i, meta.row_group(i).num_rows) for part in store.parts()
              for meta in [pq.read_metadata(part)] for i in range(meta.num_row_groups)]
    firsts = list(itertools.accumulate((rows for _, _, rows in groups), initial=0))
    times = []
    for _ in range(samples):
        row = rng.randrange(n)
        at = bisect.bisect_right(firsts, row) - 1
        part, group, _ = groups[at]
        start = time.perf_counter()
        found = pq.ParquetFile(part).read_row_group(group).take(pa.array([row - firsts[at]])).to_pylist()
        times.append(time.perf_counter() - start)
        assert len(found) == 1 and found[0]["messages"], found
    return round(statistics.median(times) * 1000, 1), len(groups)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="trajectories in the synthetic corpus")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic corpus")
    parser.add_argument("--from-store", type=Path, default=None,
                        help="use the trajectories of this store (e.g. imported real files) instead of the synthetic corpus")
    parser.add_argument("--word", default=SEARCH_WORD, help="the word the word-search query looks for")
    parser.add_argument("--workdir", default=None, help="where to write (default: a temporary folder, removed after)")
    parser.add_argument("--batch", type=int, default=None,
                        help="rows per store append (default: n/20, at most 5,000: 20 appends for compact to merge)")
    parser.add_argument("--no-zstd", action="store_true", help="skip the zstd -19 --long bound (slow on big corpora; "
                        "zstd -3 is always measured)")
    args = parser.parse_args()

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="omrl-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    jsonl_path, store_path = workdir / "corpus.jsonl", workdir / "store"
    shutil.rmtree(store_path, ignore_errors=True)

    # generated once, outside the timed writes
    rows = store_rows(args.from_store) if args.from_store else list(make_corpus(args.n, args.seed))
    warm = Store.create(workdir / "warm-up")  # imports and first-call set-up of both writers, not timed
    warm.append(to_table(rows[:1]))
    (workdir / "warm-up.jsonl").write_text(json.dumps(rows[0], ensure_ascii=False) + "\n")
    shutil.rmtree(workdir / "warm-up")

    # The baseline every ratio divides by, written JSONL_WRITES times (the median counts): on one idle machine
    # one write of the 100,000-row JSONL took 12.9 s in one run and 17.6 s in another.
    jsonl_runs = []
    for _ in range(JSONL_WRITES):
        start = time.perf_counter()
        with open(jsonl_path, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        jsonl_runs.append(time.perf_counter() - start)
    jsonl_write_s = statistics.median(jsonl_runs)

    batch = args.batch or min(5000, max(1, -(-len(rows) // 20)))
    start = time.perf_counter()
    store = Store.create(store_path)
    for i in range(0, len(rows), batch):
        store.append(to_table(rows[i:i + batch]))
    append_s = time.perf_counter() - start
    start = time.perf_counter()
    store.compact(index=False)  # the merge alone; the search index is built after it, timed apart
    compact_s = time.perf_counter() - start
    assert len(store.parts()) == 1, store.parts()  # merged whole (or one append): compact_s timed what there was
    start = time.perf_counter()
    indexed = build_missing(store)
    index_s = time.perf_counter() - start
    assert indexed == len(store.parts()), (indexed, store.parts())
    n = len(rows)
    del rows

    jsonl_bytes = jsonl_path.stat().st_size
    files = [p for p in store_path.rglob("*") if p.is_file()]
    store_bytes = sum(p.stat().st_size for p in files)
    index_bytes = sum(p.stat().st_size for p in files if any(d.endswith(INDEX_SUFFIX) for d in p.parts))
    side_bytes = sum(p.stat().st_size for p in files if SIDE_DIR in p.parts)
    part_bytes = sum(p.stat().st_size for p in store.parts())
    zstd3 = zstd3_bytes(jsonl_path)
    zstd_long = None if args.no_zstd else zstd_bytes(jsonl_path, "-19", "--long=27", "-T0")

    read_ms, row_groups = trajectory_read_ms(store, n)
    con = store.connect()
    word = args.word
    baselines = {
        "success_per_env": lambda: jsonl_success_per_env(jsonl_path),
        "groups": lambda: jsonl_groups(jsonl_path),
        "tool_counts": lambda: jsonl_tool_counts(jsonl_path),
        "word_search": lambda: jsonl_word_search(jsonl_path, word),
    }
    store_side = {name: (lambda q=sql: con.sql(q).to_arrow_table()) for name, sql in STORE_QUERIES.items()}
    # through the search index (omrl.store.search): the sorted ids of the trajectories with a hit
    store_side["word_search"] = lambda: search_ids(store, word).to_pylist()
    plain_duckdb = duckdb.connect()
    duck_side = {name: (lambda q=sql: plain_duckdb.sql(q).to_arrow_table())
                 for name, sql in duckdb_jsonl_queries(jsonl_path, word).items()}
    query_times = {}
    for name in baselines:
        store_s, result = timed(store_side[name])
        jsonl_s, expected = timed(baselines[name])
        duck_s, duck = timed(duck_side[name])
        # every side must give the same answer by value, or the timing means nothing
        if name == "word_search":  # the same trajectories, by id
            assert result == expected == duck.column("id").to_pylist() and result, (name, len(result), len(expected))
        else:
            python_answer = {k: v if isinstance(v, tuple) else (v,) for k, v in expected.items()}
            answers = (_by_key(result), python_answer, _by_key(duck))
            assert same_answers(answers[0], answers[1]) and same_answers(answers[0], answers[2]), (name, answers)
        query_times[name] = {"store_s": round(store_s, 4), "jsonl_s": round(jsonl_s, 3), "duckdb_jsonl_s": round(duck_s, 3),
                             "speedup": round(jsonl_s / store_s, 1), "speedup_duckdb_jsonl": round(duck_s / store_s, 1)}

    print(json.dumps({
        "n": n,
        "appends": -(-n // batch),
        "jsonl_bytes": jsonl_bytes,
        "store_bytes": store_bytes,
        "part_bytes": part_bytes,
        "side_bytes": side_bytes,
        "index_bytes": index_bytes,
        "zstd3_bytes": zstd3,
        "size_vs_zstd3": round(zstd3 / store_bytes, 3),
        # the same store without its search index (compact --no-index): searches then scan the parts
        "size_vs_zstd3_without_index": round(zstd3 / (store_bytes - index_bytes), 3),
        "size_ratio": round(jsonl_bytes / store_bytes, 2),
        "zstd_long_bytes": zstd_long,
        "zstd_long_ratio": round(jsonl_bytes / zstd_long, 2) if zstd_long else None,
        "jsonl_write_s": round(jsonl_write_s, 2),
        "jsonl_write_s_runs": [round(t, 2) for t in jsonl_runs],
        "append_s": round(append_s, 2),
        "compact_s": round(compact_s, 2),
        "index_s": round(index_s, 2),
        "append_ratio": round(append_s / jsonl_write_s, 3),
        "compact_ratio": round(compact_s / jsonl_write_s, 3),
        "index_ratio": round(index_s / jsonl_write_s, 3),
        "write_ratio": round((append_s + compact_s + index_s) / jsonl_write_s, 2),
        "row_groups": row_groups,
        "trajectory_read_ms": read_ms,
        "queries": query_times,
        "query_speedup_min": min(q["speedup"] for q in query_times.values()),
        "query_speedup_min_duckdb_jsonl": min(q["speedup_duckdb_jsonl"] for q in query_times.values()),
    }))
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
